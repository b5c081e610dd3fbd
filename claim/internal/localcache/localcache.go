// Package localcache is the in-process replay cache of [claim.WithReplayCache]:
// a bounded, least-recently-used map from a record's digest to its finished
// result, each entry with a deadline on the monotonic clock.
//
// Why it is safe (docs/DESIGN.md, "Replay cache in process"): a finished
// record (completed or failed) does not change until it expires. Nothing
// writes it again (the claim, the reconciler and `oncekey resolve` act on
// processing and uncertain records only), and the sweep deletes it only
// once expired. So a copy of its result answers a duplicate exactly as the
// store would, provided the copy is dropped no later than the record
// expires. The caller gives each entry a deadline that is a lower bound of
// the record's expiry on this process's monotonic clock (the time the
// reading statement was sent, plus the remaining retention the answer
// reported), and Get never answers past it. Processing, uncertain and
// released records are never put.
//
// The key is the record's [durable.Ref.Digest]: a SHA-256 over the tenant,
// the operation and the key's keyed hash, so entries are tenant-scoped and
// hold no raw key. An entry answers only the fingerprint it was stored
// with; any other request goes on to the stores, which answer a mismatch.
package localcache

import (
	"container/list"
	"sync"
	"time"

	"github.com/oncekey/oncekey/durable"
)

// EntryOverhead is what one entry costs beyond its contents: the entry,
// its list element and its map slot. HeadersOverhead is what a non-empty
// header map costs for each group of up to seven headers. Both are
// measured by TestEntryOverhead (Go 1.26, amd64) and rounded up, so that
// [Cost] never counts less than the heap an entry takes.
const (
	EntryOverhead   = 320
	HeadersOverhead = 448
)

// shards splits the cache so concurrent lookups of different keys rarely
// wait on one another; each shard has an equal share of the budget.
const shards = 16

// Cache is the replay cache. The zero value is not usable; see [New].
// Safe for concurrent use.
type Cache struct {
	shard [shards]shard
}

type shard struct {
	mu     sync.Mutex
	budget int64
	used   int64
	m      map[[32]byte]*list.Element
	lru    list.List // of *entry, most recently used first
}

type entry struct {
	key      [32]byte
	fp       string
	state    durable.State
	res      durable.Result
	deadline time.Time // on the monotonic clock
	cost     int64
}

// New returns a cache of at most maxBytes (estimated: see [Cost]); nil when
// maxBytes is not positive. An entry larger than a sixteenth of maxBytes is
// not kept.
func New(maxBytes int64) *Cache {
	if maxBytes <= 0 {
		return nil
	}
	c := &Cache{}
	for i := range c.shard {
		c.shard[i].budget = maxBytes / shards
		c.shard[i].m = make(map[[32]byte]*list.Element)
	}
	return c
}

func (c *Cache) shardOf(key [32]byte) *shard { return &c.shard[key[0]%shards] }

// Get returns a copy of the result stored under key for fingerprint fp,
// when there is one whose deadline is after now. An expired entry is
// dropped; an entry for another fingerprint stays and answers nothing.
func (c *Cache) Get(key [32]byte, fp string, now time.Time) (durable.State, durable.Result, bool) {
	s := c.shardOf(key)
	s.mu.Lock()
	el, ok := s.m[key]
	if !ok {
		s.mu.Unlock()
		return "", durable.Result{}, false
	}
	e := el.Value.(*entry)
	if !now.Before(e.deadline) {
		s.remove(el)
		s.mu.Unlock()
		return "", durable.Result{}, false
	}
	if e.fp != fp {
		s.mu.Unlock()
		return "", durable.Result{}, false
	}
	s.lru.MoveToFront(el)
	state, res := e.state, e.res
	s.mu.Unlock()
	// e.res is never written after Put: copying outside the lock is safe.
	return state, clone(res), true
}

// Put keeps a copy of res, the finished result of the record key with
// fingerprint fp, until deadline (on the monotonic clock; see the package
// documentation for what it must bound). A state that is not finished, a
// deadline not after now, or an entry over the shard's budget is not kept.
// It evicts the least recently used entries to make room.
func (c *Cache) Put(key [32]byte, fp string, state durable.State, res durable.Result, deadline, now time.Time) {
	if !state.Finished() || !deadline.After(now) {
		return
	}
	cost := Cost(fp, res)
	s := c.shardOf(key)
	if cost > s.budget {
		return
	}
	e := &entry{key: key, fp: fp, state: state, res: clone(res), deadline: deadline, cost: cost}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.m[key]; ok {
		s.remove(el)
	}
	for s.used+cost > s.budget {
		s.remove(s.lru.Back())
	}
	s.m[key] = s.lru.PushFront(e)
	s.used += cost
}

// Len is the number of entries, expired ones not yet dropped included.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shard {
		s := &c.shard[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Bytes is the estimated size of the entries (see [Cost]).
func (c *Cache) Bytes() int64 {
	var n int64
	for i := range c.shard {
		s := &c.shard[i]
		s.mu.Lock()
		n += s.used
		s.mu.Unlock()
	}
	return n
}

func (s *shard) remove(el *list.Element) {
	e := s.lru.Remove(el).(*entry)
	delete(s.m, e.key)
	s.used -= e.cost
}

// Cost is the estimated memory of an entry for fp and res: the bytes of
// its strings and body, the header map and its values, and
// [EntryOverhead].
func Cost(fp string, res durable.Result) int64 {
	n := int64(EntryOverhead + len(fp) + len(res.Body) + len(res.ResourceID))
	if len(res.Headers) > 0 {
		n += int64(HeadersOverhead * ((len(res.Headers) + 6) / 7))
	}
	for k, vs := range res.Headers {
		n += int64(len(k)) + 16 // the key; the values' backing array below
		for _, v := range vs {
			n += int64(len(v)) + 16
		}
	}
	return n
}

// clone copies res deeply, so neither the cache nor a caller sees the
// other's changes.
func clone(res durable.Result) durable.Result {
	if res.Body != nil {
		res.Body = append(make([]byte, 0, len(res.Body)), res.Body...)
	}
	if res.Headers != nil {
		h := make(map[string][]string, len(res.Headers))
		for k, vs := range res.Headers {
			h[k] = append([]string(nil), vs...)
		}
		res.Headers = h
	}
	return res
}
