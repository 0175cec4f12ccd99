package packing

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// Per-GPU packing bound. Every GPU of the cluster holds one legal configuration: a set of
// instances at free legal placements within the profiles' and the GPU's instance counts.
// Relaxing node boundaries, the order of arrival and the unity of a pod (its devices are
// counted one by one), the most requested slots any policy can allocate to a multiset of
// devices is the optimum of an integer program over how many GPUs take each
// configuration and which profile serves which device. Its linear relaxation, solved here
// (gonum's simplex) and rounded down, is an upper bound on every policy; unlike the
// capacity bound it knows that, say, an A100's eighth slot takes no 1g instance.

// gpuConfigs enumerates the distinct instance counts per profile (in c.profiles order) of
// every legal configuration of one of the cluster's GPUs.
func (c *Cluster) gpuConfigs() [][]int {
	info := c.Nodes[0][0]
	seen := map[string]bool{}
	var out [][]int
	count := make([]int, len(c.profiles))
	var walk func(used uint32, instances, from int)
	type choice struct {
		profile int
		m       uint32
	}
	var choices []choice
	for k, p := range c.profiles {
		for _, pl := range p.Placements {
			choices = append(choices, choice{k, mask(pl)})
		}
	}
	walk = func(used uint32, instances, from int) {
		key := fmt.Sprint(count)
		if !seen[key] {
			seen[key] = true
			out = append(out, slices.Clone(count))
		}
		if info.Count > 0 && instances >= info.Count {
			return
		}
		for k := from; k < len(choices); k++ {
			ch := choices[k]
			p := &c.profiles[ch.profile]
			if ch.m&used != 0 || (p.Instances > 0 && count[ch.profile] >= p.Instances) {
				continue
			}
			count[ch.profile]++
			walk(used|ch.m, instances+1, k+1)
			count[ch.profile]--
		}
	}
	walk(0, 0, 0)
	return out
}

// PackingBound is the share of the cluster's slots that the per-GPU packing bound allows
// the devices of demands to take.
func (c *Cluster) PackingBound(demands []Demand) (float64, error) {
	// Devices per class: the index of the smallest profile that holds them.
	need := make([]float64, len(c.profiles))
	classSlots := make([]float64, len(c.profiles))
	for _, d := range demands {
		k := c.profileIndex(d)
		if k < 0 {
			continue
		}
		need[k] += float64(d.Devices)
		classSlots[k] = float64(c.profiles[k].Placements[0].Size)
	}
	configs := c.gpuConfigs()
	nP := len(c.profiles)
	// Variables: x (GPUs per configuration), then y[p][q] (class-p devices on profile q,
	// q holding p).
	type pair struct{ p, q int }
	var pairs []pair
	for p := range nP {
		if need[p] == 0 {
			continue
		}
		for q := range nP {
			if c.profiles[q].MemoryMB >= c.profiles[p].MemoryMB {
				pairs = append(pairs, pair{p, q})
			}
		}
	}
	if len(pairs) == 0 {
		return 0, nil
	}
	nX := len(configs)
	nVar := nX + len(pairs)
	obj := make([]float64, nVar)
	for j, pq := range pairs {
		obj[nX+j] = -classSlots[pq.p] // minimise the negative
	}
	// G x + s = h, x, s ≥ 0: one row for the GPU count, one per profile (devices on q ≤
	// instances of q), one per class (devices of p ≤ need[p]); s are the slacks, whose
	// basis is feasible (h ≥ 0) and starts the simplex.
	rows := 1 + nP + nP
	G := mat.NewDense(rows, nVar+rows, nil)
	h := make([]float64, rows)
	for i := range nX {
		G.Set(0, i, 1)
	}
	h[0] = float64(c.GPUs())
	for q := range nP {
		for i, cfg := range configs {
			G.Set(1+q, i, -float64(cfg[q]))
		}
	}
	for j, pq := range pairs {
		G.Set(1+pq.q, nX+j, 1)
		G.Set(1+nP+pq.p, nX+j, 1)
	}
	for p := range nP {
		h[1+nP+p] = need[p]
	}
	basis := make([]int, rows)
	for r := range rows {
		G.Set(r, nVar+r, 1)
		basis[r] = nVar + r
	}
	obj = append(obj, make([]float64, rows)...)
	opt, _, err := lp.Simplex(obj, G, h, 1e-10, basis)
	if err != nil {
		return 0, fmt.Errorf("packing bound: %w", err)
	}
	return math.Floor(-opt+1e-6) / float64(c.Capacity()), nil
}

// profileIndex is the index in c.profiles of the smallest profile that holds one device of
// the demand, -1 if none does.
func (c *Cluster) profileIndex(d Demand) int {
	mem := c.memory(d)
	for k, p := range c.profiles {
		if p.MemoryMB >= mem && len(p.Placements) > 0 {
			return k
		}
	}
	return -1
}
