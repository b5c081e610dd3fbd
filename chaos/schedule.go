package chaos

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"sync"
)

// schedule draws a scenario's fault plan from the seed. Every draw is a
// pure function of (seed, scenario, what is drawn), so the same seed gives
// the same plan whatever the interleaving of the run; the planned draws are
// logged, and their digest is reported so two runs can be compared.
type schedule struct {
	seed     int64
	scenario string

	mu  sync.Mutex
	log []string
}

func newSchedule(seed int64, scenario string) *schedule {
	return &schedule{seed: seed, scenario: scenario}
}

// rnd returns a generator for the draw named by parts; it is not logged
// (use it for jitter, not for the plan).
func (s *schedule) rnd(parts ...any) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprint(h, s.seed, "|", s.scenario)
	for _, p := range parts {
		fmt.Fprint(h, "|", p)
	}
	a := h.Sum64()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], a)
	h.Write(b[:])
	return rand.New(rand.NewPCG(a, h.Sum64()))
}

func (s *schedule) record(entry string) {
	s.mu.Lock()
	s.log = append(s.log, entry)
	s.mu.Unlock()
}

// chance plans an event with probability p.
func (s *schedule) chance(p float64, parts ...any) bool {
	v := s.rnd(parts...).Float64() < p
	s.record(fmt.Sprint(parts...) + fmt.Sprintf("=%v", v))
	return v
}

// intn plans a number in [0, n).
func (s *schedule) intn(n int, parts ...any) int {
	v := s.rnd(parts...).IntN(n)
	s.record(fmt.Sprint(parts...) + fmt.Sprintf("=%d", v))
	return v
}

// plan returns the planned draws, in the order they were made.
func (s *schedule) plan() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

// digest names the plan: the first 16 hex digits of a SHA-256 over its
// draws, sorted (each draw names what it is for, so the order in which
// concurrent operations drew does not matter).
func (s *schedule) digest() string {
	p := s.plan()
	sort.Strings(p)
	h := sha256.New()
	for _, e := range p {
		fmt.Fprintln(h, e)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
