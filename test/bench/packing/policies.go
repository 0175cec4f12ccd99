package packing

import (
	"cmp"
	"slices"
	"strings"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Policy places one pod, all its devices on one node, or refuses it. It does not change
// the state; the caller applies what it returns (nil: refused).
type Policy interface {
	Name() string
	Place(st *State, d Demand) []Alloc
}

// Dynamig is the real allocator: placement.Fit on every node with the shipped options
// (MIG binpack), scored by the scheduler plugin's placement.NodeScore (binpack: the lowest
// fragmentation cost when fragmentation is on, then a node in use already). The highest
// score wins and ties go to the lowest node index, as placement.NormalizeScores ranks
// nodes named in index order.
type Dynamig struct{ FragmentationAware bool }

func (p Dynamig) Name() string {
	if p.FragmentationAware {
		return "dynamig"
	}
	return "dynamig-no-frag"
}

func (p Dynamig) Place(st *State, d Demand) []Alloc { return p.placeExcept(st, d, -1) }

// options are the allocator's options of the policy.
func (p Dynamig) options() placement.Options {
	return placement.Options{MIGPolicy: api.PolicyBinpack, HAMiCorePolicy: api.PolicySpread, FragmentationAware: p.FragmentationAware, Terse: true}
}

// request is a demand as the allocator reads it.
func request(d Demand) *placement.Request {
	return &placement.Request{Mode: api.ModeMIG, Containers: []placement.ContainerRequest{{Devices: d.Devices, MemoryMiB: d.MemoryMiB}}}
}

// placeExcept is Place on every node but skip.
func (p Dynamig) placeExcept(st *State, d Demand, skip int) []Alloc {
	opts, req := p.options(), request(d)
	best, bestScore := -1, int64(0)
	var bestRes *placement.Result
	for n, gpus := range st.Nodes {
		if n == skip {
			continue
		}
		res, why := placement.Fit(gpus, req, opts)
		if why != nil {
			continue
		}
		score := placement.NodeScore(placement.NodeUtilisation(gpus, res), 0, placement.InUse(gpus), res.Cost, api.PolicyBinpack, p.FragmentationAware)
		if best < 0 || score > bestScore {
			best, bestScore, bestRes = n, score, res
		}
	}
	if best < 0 {
		return nil
	}
	out := make([]Alloc, len(bestRes.Assignments))
	for i, a := range bestRes.Assignments {
		out[i] = Alloc{Node: best, GPU: a.GPU, Profile: a.Profile, Placement: a.Placement}
	}
	return out
}

// gpuUse is a GPU's occupancy as the baselines track it.
type gpuUse struct {
	used      uint32
	instances int
	count     map[string]int
	cores     int
	memory    int
}

func useOf(g *placement.GPU) gpuUse {
	u := gpuUse{count: map[string]int{}}
	for _, in := range g.MIG {
		u.add(g, in.Profile, in.Placement)
	}
	return u
}

func (u *gpuUse) add(g *placement.GPU, profile string, pl api.Placement) {
	u.used |= mask(pl)
	u.instances++
	u.count[profile]++
	for _, p := range g.Info.MigProfiles {
		if p.Name == profile {
			u.cores += p.Core
			u.memory += p.MemoryMB
		}
	}
}

// HAMi is HAMi v2.10's MIG placement with its defaults (node policy binpack, GPU policy
// spread), as docs/hami-v2.10.md describes it; written here, not taken from HAMi.
//
// Nodes are tried by HAMi's node score before the pod, highest first; HAMi breaks ties
// effectively at random, here the lowest node index wins. On a node the GPUs are ordered
// by the GPU score, lowest first, full ties to the highest index; the pod's devices (one
// container) go on the first GPU until it has no room, then the next. On a GPU the
// allowlisted profiles, by memory then slice count, with memory ≥ the request are tried in
// turn, each at its placements in NVML's order — descending start for 1g.* and 3g.*,
// ascending for the others — and the first placement overlapping no reservation wins. The
// only limit is instances < Count (the largest instance count of the allowed profiles).
//
// A whole-device demand (MemoryMiB 0) asks HAMi for the full-GPU profile's memory
// explicitly: HAMi's own default (100% of the card's memory) fits no MIG profile.
type HAMi struct{}

func (HAMi) Name() string { return "hami-v2.10" }

// hamiCount is HAMi's Count of a MIG GPU: the largest instance count of its profiles.
func hamiCount(g *placement.GPU) int {
	n := 0
	for _, p := range g.Info.MigProfiles {
		n = max(n, p.Instances)
	}
	return n
}

// hamiScore is HAMi's score of one GPU, as the three fractions (used, cores, memory).
func (c *Cluster) hamiFractions(g *placement.GPU, u *gpuUse) (used, total [3]float64) {
	return [3]float64{float64(u.instances), float64(u.cores), float64(u.memory)},
		[3]float64{float64(hamiCount(g)), 100, float64(c.Model.MemoryMiB)}
}

func score(used, total [3]float64) float64 {
	s := 0.0
	for i := range used {
		if total[i] > 0 {
			s += used[i] / total[i]
		}
	}
	return 10 * s
}

func (HAMi) Place(st *State, d Demand) []Alloc { return hamiPlace(st, d, hamiDevicesOnGPU) }

// hamiGPUFunc places up to n devices of mem MiB on one GPU (u is its use, updated), the
// most it can; HAMi v2.10 and hami-main differ only there.
type hamiGPUFunc func(c *Cluster, g *placement.GPU, u *gpuUse, mem, n int) []Alloc

// hamiPlace is HAMi's node and GPU order around a per-GPU placement: nodes by HAMi's node
// score before the pod (binpack: highest first, ties to the lowest index); on a node, GPUs
// by the GPU score (spread: lowest first, full ties to the highest index), the pod's
// devices on the first GPU until it takes no more, then the next.
func hamiPlace(st *State, d Demand, onGPU hamiGPUFunc) []Alloc {
	c := st.C
	type nodeScore struct {
		n     int
		score float64
	}
	order := make([]nodeScore, len(st.Nodes))
	for n, gpus := range st.Nodes {
		var used, total [3]float64
		for i := range gpus {
			u := useOf(&gpus[i])
			gu, gt := c.hamiFractions(&gpus[i], &u)
			for k := range used {
				used[k] += gu[k]
				total[k] += gt[k]
			}
		}
		order[n] = nodeScore{n, score(used, total)}
	}
	slices.SortStableFunc(order, func(a, b nodeScore) int { return cmp.Compare(b.score, a.score) })
	for _, ns := range order {
		if as := hamiPlaceNode(st, ns.n, d, onGPU); as != nil {
			return as
		}
	}
	return nil
}

func hamiPlaceNode(st *State, n int, d Demand, onGPU hamiGPUFunc) []Alloc {
	c, gpus := st.C, st.Nodes[n]
	uses := make([]gpuUse, len(gpus))
	scores := make([]float64, len(gpus))
	order := make([]int, len(gpus))
	for i := range gpus {
		uses[i] = useOf(&gpus[i])
		scores[i] = score(c.hamiFractions(&gpus[i], &uses[i]))
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(cmp.Compare(scores[a], scores[b]), cmp.Compare(b, a)) })
	mem := c.memory(d)
	var out []Alloc
	for _, i := range order {
		if len(out) == d.Devices {
			break
		}
		for _, a := range onGPU(c, &gpus[i], &uses[i], mem, d.Devices-len(out)) {
			a.Node, a.GPU = n, i
			out = append(out, a)
		}
	}
	if len(out) < d.Devices {
		return nil
	}
	return out
}

// hamiDevicesOnGPU is v2.10 on one GPU.
func hamiDevicesOnGPU(c *Cluster, g *placement.GPU, u *gpuUse, mem, n int) []Alloc {
	return hamiGreedy(c, g, u, mem, n, hamiFirst)
}

// hamiGreedy places up to n devices on the GPU one after another, each at hamiOnGPU's
// choice with pick, until one does not fit; u takes them.
func hamiGreedy(c *Cluster, g *placement.GPU, u *gpuUse, mem, n int, pick func(*Cluster, uint32, []api.Placement) api.Placement) []Alloc {
	var out []Alloc
	for range n {
		prof, pl, ok := hamiOnGPU(c, g, u, mem, pick)
		if !ok {
			break
		}
		u.add(g, prof, pl)
		out = append(out, Alloc{Profile: prof, Placement: pl})
	}
	return out
}

// hamiOnGPU is HAMi's choice of profile and placement on one GPU: the first profile, by
// memory then slices, with memory ≥ the request and a free placement (v2.10 allows no
// more than Count instances), and among its free placements, in v2.10's order, the one
// choose picks. v2.10 takes the first.
func hamiOnGPU(c *Cluster, g *placement.GPU, u *gpuUse, mem int, choose func(c *Cluster, used uint32, free []api.Placement) api.Placement) (string, api.Placement, bool) {
	if u.instances >= hamiCount(g) {
		return "", api.Placement{}, false
	}
	for _, p := range c.profiles {
		if p.MemoryMB < mem {
			continue
		}
		var free []api.Placement
		for _, pl := range hamiOrder(p) {
			if mask(pl)&u.used == 0 {
				free = append(free, pl)
			}
		}
		if len(free) > 0 {
			return p.Name, choose(c, u.used, free), true
		}
	}
	return "", api.Placement{}, false
}

// hamiFirst is v2.10's pick among a profile's free placements: the first in its order.
func hamiFirst(_ *Cluster, _ uint32, free []api.Placement) api.Placement { return free[0] }

// hamiOrder is v2.10's placement order of a profile: descending start for 1g and 3g.
func hamiOrder(p api.MigProfile) []api.Placement {
	out := slices.Clone(p.Placements)
	if strings.HasPrefix(p.Name, "1g.") || strings.HasPrefix(p.Name, "3g.") {
		slices.Reverse(out)
	}
	return out
}

// FirstFit takes the first GPU (nodes in order, GPUs in index order) that fits a device,
// and on it the smallest profile (by memory, then slices) with memory ≥ the request at its
// lowest free start. Limits: no overlap and each profile's instance count. A pod's devices
// stay on one node.
type FirstFit struct{}

func (FirstFit) Name() string { return "first-fit" }

func (FirstFit) Place(st *State, d Demand) []Alloc {
	c := st.C
	mem := c.memory(d)
	for n, gpus := range st.Nodes {
		uses := make([]gpuUse, len(gpus))
		for i := range gpus {
			uses[i] = useOf(&gpus[i])
		}
		var out []Alloc
		for range d.Devices {
			a, ok := firstFitDevice(c, gpus, uses, mem)
			if !ok {
				out = nil
				break
			}
			a.Node = n
			uses[a.GPU].add(&gpus[a.GPU], a.Profile, a.Placement)
			out = append(out, a)
		}
		if out != nil {
			return out
		}
	}
	return nil
}

func firstFitDevice(c *Cluster, gpus []placement.GPU, uses []gpuUse, mem int) (Alloc, bool) {
	for i := range gpus {
		for _, p := range c.profiles {
			if p.MemoryMB < mem || (p.Instances > 0 && uses[i].count[p.Name] >= p.Instances) {
				continue
			}
			starts := slices.Clone(p.Placements)
			slices.SortFunc(starts, func(a, b api.Placement) int { return cmp.Compare(a.Start, b.Start) })
			for _, pl := range starts {
				if mask(pl)&uses[i].used == 0 {
					return Alloc{GPU: i, Profile: p.Name, Placement: pl}, true
				}
			}
		}
	}
	return Alloc{}, false
}
