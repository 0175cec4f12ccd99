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
	return optimum(c, demands, false, OptimalBudget)
}

// PlacesAll reports whether some assignment places every demand together on an empty
// one-node cluster: the search of Optimal without its skip branch, stopped at the first
// complete assignment. exact is false when the budget ran out before an answer.
func PlacesAll(c *Cluster, demands []Demand, budget int) (ok, exact bool) {
	best, exact := optimum(c, demands, true, budget)
	return best == len(demands), exact || best == len(demands)
}

func optimum(c *Cluster, demands []Demand, placeAll bool, budget int) (best int, exact bool) {
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
		if nodes > budget {
			exact = false
			return
		}
		best = max(best, placed)
		if i == len(demands) || placed+len(demands)-i <= best || (placeAll && placed < i) {
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
		if placed+fit <= best || (placeAll && placed+fit < len(demands)) {
			return
		}
		k := key(i)
		if v, ok := seen[k]; ok && v >= placed {
			return
		}
		seen[k] = placed
		placeDevices(i, placed, 0, 0)
		if !placeAll {
			search(i+1, placed)
		}
	}
	// placeDevices places device dev of pod i at choices numbered from 'from' on.
	placeDevices = func(i, placed, dev, from int) {
		d := demands[i]
		if dev == d.Devices {
			search(i+1, placed+1)
			return
		}
		if placeAll && best == len(demands) {
			return // found: stop searching
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

// FillResult is one static fill: a window of trace pods that an optimal assignment places
// entirely, placed in order by each policy into an empty node.
type FillResult struct {
	// Window is the first trace pod's index; Size the window's pods (= the optimum).
	Window, Size int
	// Placed is, per policy, the window's pods placed (refused ones skipped).
	Placed map[string]int
}

// FillBudget bounds each PlacesAll search of a window; a search past it counts as "does
// not fit", so a window only ever holds a multiset proven to fit.
const FillBudget = 2_000_000

// FillWindow builds a static-fill window from the trace pods from start on: each pod joins
// the window if the window with it still fits the empty node entirely (PlacesAll), and is
// passed over otherwise; it ends at maxPods pods, after maxMisses pods passed over in a
// row (the node is full for what follows), or at the trace's end. The optimum of the
// window is therefore all of it, exactly.
func FillWindow(c *Cluster, pods []Pod, start, maxPods, maxMisses int) []Demand {
	var window []Demand
	misses := 0
	for i := start; i < len(pods) && len(window) < maxPods && misses < maxMisses; i++ {
		d := c.Demand(pods[i])
		if c.ProfileSlots(d) == 0 || d.Devices > c.GPUs() {
			continue // fits no empty node: not a packing question
		}
		if ok, _ := PlacesAll(c, append(window, d), FillBudget); ok {
			window = append(window, d)
			misses = 0
		} else {
			misses++
		}
	}
	return window
}

// StaticFill places the window in order on an empty one-node cluster with every policy.
func StaticFill(c *Cluster, policies []Policy, window []Demand, check bool) (FillResult, error) {
	r := FillResult{Size: len(window), Placed: map[string]int{}}
	for _, p := range policies {
		st := NewState(c)
		for _, d := range window {
			as := p.Place(st, d)
			if as == nil {
				continue
			}
			st.Apply(as)
			if check {
				if err := st.Check(); err != nil {
					return r, fmt.Errorf("static fill, %s: %w", p.Name(), err)
				}
			}
			r.Placed[p.Name()]++
		}
	}
	return r, nil
}
