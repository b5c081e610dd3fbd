package check

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/fence"
)

// record is the sequential specification's state of one logical operation:
// the durable record as its clients may have seen it.
type record struct {
	gen   uint64      // highest generation granted
	owner uuid.UUID   // holder of gen; phantom after an acquisition nobody saw
	fp    string      // fingerprint of the current claim
	done  bool        // a result is stored
	by    fence.Token // the token that stored it
	body  string      // hash of the stored body
}

// phantom owns a claim that may have been granted to a caller who never
// learned its token (an ambiguous claim).
var phantom = uuid.Max

// step is the per-operation model: which states the record may be in after
// the call c, from state s. No state means the call was impossible.
//
//   - A claim (Acquire, Adopt, Execute) needs a generation above every one
//     granted before it, and no stored result: the durable generation only
//     rises, and a finished operation is never run again within its
//     retention window.
//   - A Complete is accepted only from the current token (or again, with
//     the same body, from the token that already stored it): no completion
//     from a stale token.
//   - A Replay returns exactly the stored body, and only to a request of
//     the fingerprint that stored it: a key reused with another payload is
//     rejected, never answered with the first payload's result.
//   - A Mismatch needs a claim with another fingerprint.
//   - An ambiguous call either did nothing or did what it tried.
func step(s record, c history.Call) []record {
	tok := c.Token
	switch c.Kind {
	case history.Acquire:
		if c.Ambiguous {
			out := []record{s}
			if !s.done {
				p := s
				p.owner, p.fp = phantom, c.Fingerprint
				out = append(out, p)
			}
			return out
		}
		if s.done || tok.Generation <= s.gen {
			return nil
		}
		n := s
		n.gen, n.owner, n.fp = tok.Generation, tok.Owner, c.Fingerprint
		return []record{n}
	case history.Adopt:
		if c.Ambiguous {
			return []record{s}
		}
		if s.done || tok.Generation <= s.gen {
			return nil
		}
		n := s
		n.gen, n.owner = tok.Generation, tok.Owner
		return []record{n}
	case history.Execute:
		ok := !s.done && tok.Generation > s.gen
		n := s
		n.gen, n.owner, n.fp, n.done, n.by, n.body = tok.Generation, tok.Owner, c.Fingerprint, true, tok, c.Body
		switch {
		case c.Ambiguous && ok:
			return []record{s, n}
		case c.Ambiguous:
			return []record{s}
		case ok:
			return []record{n}
		}
		return nil
	case history.Complete:
		applies := !s.done && s.gen == tok.Generation && s.owner == tok.Owner
		again := s.done && s.by == tok && s.body == c.Body
		n := s
		n.done, n.by, n.body = true, tok, c.Body
		switch {
		case c.Ambiguous && applies:
			return []record{s, n}
		case c.Ambiguous:
			return []record{s}
		case applies:
			return []record{n}
		case again:
			return []record{s}
		}
		return nil
	case history.Replay:
		// A history that did not record a fingerprint (either side) is
		// judged by the body alone.
		if s.done && s.body == c.Body && (s.fp == "" || c.Fingerprint == "" || s.fp == c.Fingerprint) {
			return []record{s}
		}
		return nil
	case history.Mismatch:
		if s.fp != "" && s.fp != c.Fingerprint {
			return []record{s}
		}
		return nil
	}
	return []record{s}
}

// informative reports whether a call can change or contradict the model's
// state; the others (no effect, fenced) are legal anywhere and are left
// out of the search.
func informative(c history.Call) bool {
	return c.Kind != history.NoEffect && c.Kind != history.Fenced
}

func model() porcupine.Model {
	nm := &porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var names []string
			for _, op := range h {
				name := op.Input.(history.Call).Op()
				if _, ok := by[name]; !ok {
					names = append(names, name)
				}
				by[name] = append(by[name], op)
			}
			sort.Strings(names)
			out := make([][]porcupine.Operation, 0, len(names))
			for _, n := range names {
				out = append(out, by[n])
			}
			return out
		},
		Init: func() []any { return []any{record{}} },
		Step: func(state, input, _ any) []any {
			next := step(state.(record), input.(history.Call))
			out := make([]any, len(next))
			for i, r := range next {
				out[i] = r
			}
			return out
		},
		Equal: func(a, b any) bool { return a.(record) == b.(record) },
		DescribeOperation: func(input, _ any) string {
			c := input.(history.Call)
			amb := ""
			if c.Ambiguous {
				amb = "?"
			}
			return fmt.Sprintf("%s%s gen=%d body=%.8s", c.Kind, amb, c.Token.Generation, c.Body)
		},
		DescribeState: func(state any) string { return describeState(state.(record)) },
		DescribeOperationMetadata: func(info any) string {
			s, _ := info.(string)
			return s
		},
	}
	return nm.ToModel()
}

// linearize checks the calls with porcupine, one partition per logical
// operation. Ambiguous calls get an open end, so both of their outcomes
// are explored at any point after they started. It returns the operations
// whose history no sequential execution of the record explains, and how
// many partitions the search could not finish within timeout each.
func linearize(calls []history.Call, timeout time.Duration) (illegal []string, checked, unknown int) {
	var ops []porcupine.Operation
	for _, c := range calls {
		if !informative(c) {
			continue
		}
		end := int64(c.End)
		if c.Ambiguous {
			end = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: c, Call: int64(c.Start), Return: end})
	}
	if len(ops) == 0 {
		return nil, 0, 0
	}
	m := model()
	for _, part := range m.Partition(ops) {
		checked++
		switch porcupine.CheckOperationsTimeout(m, part, timeout) {
		case porcupine.Illegal:
			illegal = append(illegal, part[0].Input.(history.Call).Op())
		case porcupine.Unknown:
			unknown++
		}
	}
	return illegal, checked, unknown
}
