package packing

import (
	"math/bits"
	"strings"

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
	greedy.count = cloneCounts(u.count)
	var out []Alloc
	for range n {
		prof, pl, ok := hamiMainOnGPU(c, g, &greedy, mem)
		if !ok {
			break
		}
		greedy.add(g, prof, pl)
		out = append(out, Alloc{Profile: prof, Placement: pl})
	}
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

func cloneCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// hamiMainOnGPU is the greedy choice for one device: v2.10's profile, the best-scored
// free placement of it.
func hamiMainOnGPU(c *Cluster, g *placement.GPU, u *gpuUse, mem int) (string, api.Placement, bool) {
	if u.instances >= hamiCount(g) {
		return "", api.Placement{}, false
	}
	for _, p := range c.profiles {
		if p.MemoryMB < mem {
			continue
		}
		best, bestRun, bestLeft, found := api.Placement{}, -1, -1, false
		for _, pl := range hamiOrder(p) {
			m := mask(pl)
			if m&u.used != 0 {
				continue
			}
			run, left := c.hamiMainScore(u.used | m)
			if run > bestRun || (run == bestRun && left > bestLeft) {
				best, bestRun, bestLeft, found = pl, run, left, true
			}
		}
		if found {
			return p.Name, best, true
		}
	}
	return "", api.Placement{}, false
}

// hamiOrder is v2.10's placement order of a profile: descending start for 1g and 3g.
func hamiOrder(p api.MigProfile) []api.Placement {
	out := make([]api.Placement, len(p.Placements))
	desc := strings.HasPrefix(p.Name, "1g.") || strings.HasPrefix(p.Name, "3g.")
	for k := range p.Placements {
		j := k
		if desc {
			j = len(p.Placements) - 1 - k
		}
		out[k] = p.Placements[j]
	}
	return out
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
