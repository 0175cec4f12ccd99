package packing

import (
	"maps"
	"math/bits"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// HAMiMain is HAMi's MIG placement on its main branch after pull request 2855 (merged
// August 2026), written from that pull request's description, not from HAMi's code: node
// and GPU order as in v2.10 (hamiPlace). Within a GPU the requests with the fewest legal
// placements go first (a pod here is one container of like devices, so their order is
// moot); each device takes the profile v2.10 would (the smallest by memory, then slices,
// with a free placement), at the free placement that leaves the largest contiguous run of
// free slots, then the most placements of the GPU's profiles still possible, then v2.10's
// placement order. When that greedy pass does not place every device the GPU is asked
// for, a backtracking search over every free placement of every profile large enough
// looks for an assignment of more of them. Limits as in v2.10: instances < Count.
type HAMiMain struct{}

func (HAMiMain) Name() string { return "hami-main" }

func (HAMiMain) Place(st *State, d Demand) []Alloc { return hamiPlace(st, d, hamiMainDevicesOnGPU) }

func hamiMainDevicesOnGPU(c *Cluster, g *placement.GPU, u *gpuUse, mem, n int) []Alloc {
	greedy := *u
	greedy.count = maps.Clone(u.count)
	out := hamiGreedy(c, g, &greedy, mem, n, hamiMainPick)
	if len(out) < n {
		if more := hamiMainBacktrack(c, g, u, mem, n); len(more) > len(out) {
			out = more
		}
	}
	for _, a := range out {
		u.add(g, a.Profile, a.Placement)
	}
	return out
}

// hamiMainPick is hami-main's pick among a profile's free placements: the one leaving the
// longest run of free slots, then the most placements of the GPU's profiles still free,
// then the first in v2.10's order.
func hamiMainPick(c *Cluster, used uint32, free []api.Placement) api.Placement {
	best, bestRun, bestLeft := free[0], -1, -1
	for _, pl := range free {
		if run, left := c.hamiMainScore(used | mask(pl)); run > bestRun || (run == bestRun && left > bestLeft) {
			best, bestRun, bestLeft = pl, run, left
		}
	}
	return best
}

// hamiMainScore is the score of a GPU's slots once used: the longest run of free slots,
// and how many placements of its profiles stay free.
func (c *Cluster) hamiMainScore(used uint32) (run, left int) {
	cur := 0
	for s := range c.Slots {
		if used&(1<<uint(s)) == 0 {
			cur++
			run = max(run, cur)
		} else {
			cur = 0
		}
	}
	for _, p := range c.profiles {
		for _, pl := range p.Placements {
			if mask(pl)&used == 0 {
				left++
			}
		}
	}
	return run, left
}

// hamiMainBacktrack searches, depth first in the greedy's order of preference, for the
// largest set of at most n devices on the GPU: each at any free placement of any profile
// with enough memory, within instances < Count.
func hamiMainBacktrack(c *Cluster, g *placement.GPU, u *gpuUse, mem, n int) []Alloc {
	limit := hamiCount(g)
	type choice struct {
		profile string
		pl      api.Placement
	}
	var candidates []choice
	for _, p := range c.profiles {
		if p.MemoryMB >= mem {
			for _, pl := range hamiOrder(p) {
				candidates = append(candidates, choice{p.Name, pl})
			}
		}
	}
	var best, cur []Alloc
	var search func(used uint32, instances, from int)
	search = func(used uint32, instances, from int) {
		if len(cur) > len(best) {
			best = append(best[:0], cur...)
		}
		if len(best) == n || len(cur) == n || instances >= limit {
			return
		}
		// Not enough free slots left for more than best: cut.
		if free := c.Slots - bits.OnesCount32(used); len(cur)+free < len(best)+1 {
			return
		}
		for k := from; k < len(candidates); k++ {
			m := mask(candidates[k].pl)
			if m&used != 0 {
				continue
			}
			cur = append(cur, Alloc{Profile: candidates[k].profile, Placement: candidates[k].pl})
			search(used|m, instances+1, k) // like devices: non-decreasing choice order
			cur = cur[:len(cur)-1]
			if len(best) == n {
				return
			}
		}
	}
	search(u.used, u.instances, 0)
	return best
}
