package packing

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// PlacesAll reports whether some assignment places every demand together on an empty
// one-node cluster (every GPU of the node; devices of a pod may share a GPU), by exhaustive
// depth-first search: every device of each pod on any GPU, any published profile with
// enough memory, any free legal placement, within the profile's and the GPU's instance
// counts, stopped at the first complete assignment. Cuts: the pods left whose minimal slot
// needs exceed the free slots; a (pod index, multiset of GPU states) seen before; identical
// devices of a pod placed in non-decreasing (GPU, profile, placement) order. exact is false
// when the budget of search nodes ran out before an answer.
func PlacesAll(c *Cluster, demands []Demand, budget int) (ok, exact bool) {
	if len(c.Nodes) != 1 {
		panic("PlacesAll takes a one-node cluster")
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
	// need[i] is the slots the pods from i on need at least.
	need := make([]int, len(demands)+1)
	for i := len(demands) - 1; i >= 0; i-- {
		d := demands[i]
		slots := 1 << 20 // no profile holds it
		if s := c.ProfileSlots(d); s > 0 {
			slots = s * d.Devices
		}
		need[i] = need[i+1] + slots
	}
	capacity := len(gpus) * c.Slots
	seen := map[string]bool{}
	nodes := 0
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
	exact = true
	var search func(i int)
	var placeDevices func(i, dev, from int)
	search = func(i int) {
		if nodes++; nodes > budget {
			exact = false
			return
		}
		if i == len(demands) {
			ok = true
			return
		}
		if need[i] > capacity-usedSlots() {
			return
		}
		k := key(i)
		if seen[k] {
			return
		}
		seen[k] = true
		placeDevices(i, 0, 0)
	}
	// placeDevices places device dev of pod i at choices numbered from 'from' on.
	placeDevices = func(i, dev, from int) {
		d := demands[i]
		if dev == d.Devices {
			search(i + 1)
			return
		}
		mem := c.memory(d)
		choice := 0
		for g := range states {
			s := &states[g]
			for k, p := range profs {
				for _, m := range p.masks {
					choice++
					if ok || choice-1 < from || p.mem < mem || s.used&m != 0 ||
						(p.instances > 0 && int(s.count[k]) >= p.instances) || (maxGIs > 0 && s.gis >= maxGIs) {
						continue
					}
					old := *s
					s.used |= m
					s.gis++
					s.count[k]++
					placeDevices(i, dev+1, choice-1)
					*s = old
				}
			}
		}
	}
	search(0)
	return ok, exact || ok
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
