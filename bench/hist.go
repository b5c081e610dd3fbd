package main

import (
	"math/bits"
	"time"
)

// histSub is log2 of the sub-buckets per power of two: 32 sub-buckets, so a
// recorded value is off by less than 1/32 (reported as the bucket's middle,
// by less than 1.6%).
const histSub = 5

const histBuckets = (64 - histSub + 1) << histSub

// hist is a log-linear latency histogram in nanoseconds. Recording does not
// allocate. It is not safe for concurrent use: each worker has its own, and
// they are merged.
type hist struct {
	counts [histBuckets]uint64
	n      uint64
	max    uint64
}

func bucketOf(v uint64) int {
	if v < 1<<(histSub+1) {
		return int(v)
	}
	shift := bits.Len64(v) - 1 - histSub
	return (shift+1)<<histSub + int(v>>shift) - 1<<histSub
}

// bucketLow is the smallest value of bucket i.
func bucketLow(i int) uint64 {
	g := i >> histSub
	if g == 0 {
		return uint64(i)
	}
	shift := g - 1
	return (uint64(i&(1<<histSub-1)) + 1<<histSub) << shift
}

func (h *hist) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	h.n++
	h.max = max(h.max, v)
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile (0 < q ≤ 1): the middle of the bucket
// holding the ⌈q·n⌉-th smallest value, never above the largest value seen,
// which is what it returns for the n-th. It returns 0 for an empty
// histogram.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999)
	rank = min(max(rank, 1), h.n)
	if rank == h.n {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo := bucketLow(i)
			hi := lo
			if i+1 < histBuckets {
				hi = bucketLow(i + 1)
			}
			return time.Duration(min(lo+(hi-lo)/2, h.max))
		}
	}
	return time.Duration(h.max)
}
