package packing

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// OptimalBudget bounds the search nodes of Optimal; past it the result is a lower bound.
const OptimalBudget = 20_000_000

// Optimal is the most of the demands that any assignment places together on an empty
// one-node cluster (every GPU of the node; devices of a pod may share a GPU), by
// exhaustive depth-first search: each pod is placed (every device on any GPU, any
// published profile with enough memory, any free legal placement, within the profile's and
// the GPU's instance counts) or skipped. Bounds: (1) placed + pods left ≤ best so far, and
// (2) placed + the most of the pods left whose minimal slot needs fit the free slots ≤ best
// so far; memoisation: a (pod index, multiset of GPU states) seen before with at least as
// many placed is cut; identical devices of a pod are placed in non-decreasing (GPU,
// profile, placement) order. exact is false when the budget ran out.
func Optimal(c *Cluster, demands []Demand) (best int, exact bool) {
	if len(c.Nodes) != 1 {
		panic("Optimal takes a one-node cluster")
	}
	gpus := c.Nodes[0]
	type prof struct {
		mem, instances int
		masks          []uint32
	}
	var profs []prof
	for _, p := range c.profiles {
		pr := prof{mem: p.MemoryMB, instances: p.Instances}
		for _, pl := range p.Placements {
			pr.masks = append(pr.masks, mask(pl))
		}
		profs = append(profs, pr)
	}
	maxGIs := gpus[0].Count
	type gpuState struct {
		used  uint32
		gis   int
		count [24]uint8
	}
	states := make([]gpuState, len(gpus))
	minSlots := make([]int, len(demands))
	for i, d := range demands {
		if s := c.ProfileSlots(d); s > 0 {
			minSlots[i] = s * d.Devices
		} else {
			minSlots[i] = 1 << 20 // no profile holds it
		}
	}
	// suffix[i] is minSlots[i:], sorted.
	suffix := make([][]int, len(demands)+1)
	for i := range demands {
		suffix[i] = slices.Sorted(slices.Values(minSlots[i:]))
	}
	capacity := len(gpus) * c.Slots
	seen := map[string]int{}
	nodes := 0
	exact = true
	key := func(i int) string {
		parts := make([]string, len(states))
		for g, s := range states {
			parts[g] = fmt.Sprintf("%x/%x", s.used, s.count[:len(profs)])
		}
		slices.Sort(parts)
		return fmt.Sprint(i, ":", strings.Join(parts, ","))
	}
	usedSlots := func() int {
		n := 0
		for _, s := range states {
			n += bits.OnesCount32(s.used)
		}
		return n
	}
	var search func(i, placed int)
	var placeDevices func(i, placed, dev, from int)
	search = func(i, placed int) {
		nodes++
		if nodes > OptimalBudget {
			exact = false
			return
		}
		best = max(best, placed)
		if i == len(demands) || placed+len(demands)-i <= best {
			return
		}
		free, fit := capacity-usedSlots(), 0
		for _, s := range suffix[i] {
			if s > free {
				break
			}
			free -= s
			fit++
		}
		if placed+fit <= best {
			return
		}
		k := key(i)
		if v, ok := seen[k]; ok && v >= placed {
			return
		}
		seen[k] = placed
		placeDevices(i, placed, 0, 0)
		search(i+1, placed)
	}
	// placeDevices places device dev of pod i at choices numbered from 'from' on.
	placeDevices = func(i, placed, dev, from int) {
		d := demands[i]
		if dev == d.Devices {
			search(i+1, placed+1)
			return
		}
		mem := c.memory(d)
		choice := 0
		for g := range states {
			s := &states[g]
			for k, p := range profs {
				for _, m := range p.masks {
					choice++
					if choice-1 < from || p.mem < mem || s.used&m != 0 ||
						(p.instances > 0 && int(s.count[k]) >= p.instances) || (maxGIs > 0 && s.gis >= maxGIs) {
						continue
					}
					old := *s
					s.used |= m
					s.gis++
					s.count[k]++
					placeDevices(i, placed, dev+1, choice-1)
					*s = old
				}
			}
		}
	}
	search(0, 0)
	return best, exact
}

// FillResult is one static fill: pods placed in order into an empty cluster.
type FillResult struct {
	// Window is the first pod's index in the trace; Size the window's pods.
	Window, Size int
	// Prefix is, per policy, the pods placed before the first refusal; Skipping the pods
	// placed when refused ones are skipped and the rest still tried.
	Prefix, Skipping map[string]int
	Optimal          int
	Exact            bool
}

// StaticFill places demands in order on an empty one-node cluster with every policy and
// computes the optimum of the same multiset.
func StaticFill(c *Cluster, policies []Policy, demands []Demand, check bool) (FillResult, error) {
	r := FillResult{Size: len(demands), Prefix: map[string]int{}, Skipping: map[string]int{}}
	for _, p := range policies {
		st := NewState(c)
		refused := false
		for _, d := range demands {
			as := p.Place(st, d)
			if as == nil {
				refused = true
				continue
			}
			st.Apply(as)
			if check {
				if err := st.Check(); err != nil {
					return r, fmt.Errorf("static fill, %s: %w", p.Name(), err)
				}
			}
			r.Skipping[p.Name()]++
			if !refused {
				r.Prefix[p.Name()]++
			}
		}
	}
	r.Optimal, r.Exact = Optimal(c, demands)
	for _, p := range policies {
		if r.Skipping[p.Name()] > r.Optimal && r.Exact {
			return r, fmt.Errorf("%s placed %d pods, more than the optimum %d", p.Name(), r.Skipping[p.Name()], r.Optimal)
		}
	}
	return r, nil
}
