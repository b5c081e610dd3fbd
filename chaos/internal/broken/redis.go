package broken

import (
	"context"
	"encoding"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
)

// RetryTakesLease breaks the Claimer's Redis client rather than the store:
// every lease claim.lua grants is confirmed the moment its reply comes
// back, as claim.lua's leases were before issue 43, and the Claimers trust
// a confirmed lease for its whole length (lua.Options.TrustLease, as every
// confirmed lease answered alone then; without it the library reads the
// record and the bug is harmless). A retry of a finished operation whose
// result Redis does not hold (too large to cache, flushed, lost) takes a
// lease only to read the durable store and replay, and the retries beside
// it meet a confirmed lease and are answered "in progress" until it has
// replayed. The store and the library are the real ones.
const RetryTakesLease Mode = "retry-takes-lease"

// Redis reports whether m breaks the Claimers' Redis clients ([TakeLeases])
// rather than the store or the settlement engine.
func (m Mode) Redis() bool { return m == RetryTakesLease }

// hookable is a go-redis client that takes hooks (every client kind).
type hookable interface {
	redis.Scripter
	AddHook(redis.Hook)
}

// TakeLeases gives c, the Redis client of a Claimer, the bug of
// [RetryTakesLease]: a go-redis hook that, right after a claim.lua call
// (EVALSHA or EVAL, alone or in a pipeline) answered "acquired", turns the
// tentative lease it left ("T...", lua/record.lua) into a confirmed one
// ("L...", the TTL kept), before the reply reaches the Claimer. onConfirm,
// when set, is called for each lease confirmed. The Claimer's calls still
// go through c itself (its gate, its pipelines), so only the bug differs
// from a correct run. Hook a client once, however many Claimers share it.
// It reports false, adding nothing, for a client that takes no hooks.
func TakeLeases(c redis.Scripter, onConfirm func()) bool {
	h, ok := c.(hookable)
	if !ok {
		return false
	}
	h.AddHook(leaseTaker{c: h, onConfirm: onConfirm})
	return true
}

// claimSource is claim.lua as the fast path loads it, and claimSHA its
// SHA1: how the hook knows claim.lua's calls among the others.
var (
	claimSource = fastpath.Source("claim.lua")
	claimSHA    = redis.NewScript(claimSource).Hash()
)

// confirmScript turns the tentative lease whose value is "T" .. ARGV[1]
// into a confirmed one with the same value and TTL; anything else is left
// as it is (the lease gone, replaced, or confirmed already).
var confirmScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'T' and string.sub(v, 2, #ARGV[1] + 1) == ARGV[1] then
  redis.call('SET', KEYS[1], 'L' .. string.sub(v, 2), 'KEEPTTL')
  return 1
end
return 0`)

// confirmTimeout bounds the confirmation of one lease.
const confirmTimeout = time.Second

type leaseTaker struct {
	c         hookable
	onConfirm func()
}

func (h leaseTaker) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h leaseTaker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.confirm(ctx, cmd)
		return err
	}
}

func (h leaseTaker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.confirm(ctx, cmd)
		}
		return err
	}
}

// confirm confirms the lease cmd took, when cmd is a claim.lua call that
// answered "acquired": the lease's value starts with "T" and the
// generation claim.lua answered, then ':' (the bug: confirmed before the
// durable store said anything).
func (h leaseTaker) confirm(ctx context.Context, cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 4 || !isClaim(args) {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return
	}
	reply, err := c.Slice()
	if err != nil || len(reply) < 2 || reply[0] != "acquired" {
		return
	}
	gen, ok := reply[1].(string)
	key, kok := text(args[3])
	if !ok || !kok {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	if n, err := confirmScript.Run(cctx, h.c, []string{key}, gen+":").Int(); err == nil && n == 1 && h.onConfirm != nil {
		h.onConfirm()
	}
}

// isClaim reports whether a command's arguments are claim.lua's call:
// EVALSHA of its SHA1, or EVAL of its source.
func isClaim(args []any) bool {
	name, _ := text(args[0])
	body, _ := text(args[1])
	switch strings.ToLower(name) {
	case "evalsha":
		return body == claimSHA
	case "eval":
		return body == claimSource
	}
	return false
}

// text returns a command argument as go-redis writes it, for the kinds the
// fast path sends as text (strings, pointers to strings, binary
// marshalers, integers).
func text(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return v, true
	case *string:
		if v != nil {
			return *v, true
		}
	case []byte:
		return string(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case *int64:
		if v != nil {
			return strconv.FormatInt(*v, 10), true
		}
	case encoding.BinaryMarshaler:
		if b, err := v.MarshalBinary(); err == nil {
			return string(b), true
		}
	}
	return "", false
}
