package placement

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"

	"github.com/dynamig/dynamig/api"
)

// Request is a pod's GPU request, parsed once per scheduling cycle.
type Request struct {
	// Containers asking for the count resource, in containerIndex order.
	Containers []ContainerRequest
	// Mode is api.ModeMIG, api.ModeHAMiCore or "" (either pool).
	Mode string
	// UseTypes/NoUseTypes are substrings of the GPU type, lowercased: they match the
	// lowercased type. UseUUIDs/NoUseUUIDs are exact GPU UUIDs, sorted and without
	// duplicates: they are binary-searched. request.Parse normalises and bounds all four
	// once, so that Filter only compares.
	UseTypes, NoUseTypes, UseUUIDs, NoUseUUIDs []string
	// GPUPolicy overrides Options' per-pool GPU policy when set.
	GPUPolicy string
	// NUMABind keeps all the pod's devices on GPUs of one NUMA node (nvidia.com/numa-bind).
	NUMABind bool `json:",omitempty"`
}

// ContainerRequest is one container's devices; each device needs the same.
type ContainerRequest struct {
	// Index is the containerIndex: init containers, then containers.
	Index   int
	Devices int
	// MemoryMiB per device, 0 if not given; MemoryPercent of the device (on MIG, that share
	// of the GPU: migDemandOf), 0 if not given. Neither: Options.DefaultMemory, and 0 there
	// means the whole device.
	MemoryMiB, MemoryPercent int
	// Cores is the percentage of a device's SMs (MIG: of the full-GPU profile's).
	Cores int
}

// Options are the allocator's settings, from the plugin args and the device config.
type Options struct {
	MIGPolicy, HAMiCorePolicy string
	FragmentationAware        bool
	// DefaultMemory and DefaultCores are the device config's defaultMemory and
	// defaultCores, for a container that names no memory or no cores.
	DefaultMemory, DefaultCores int
	// Terse leaves a MIG refusal's Detail empty (its Reason is the same): telling which GPU
	// refused a device and why asks every GPU again and formats a message for each, on
	// every node a pod does not fit; Filter wants details only when it logs them.
	Terse bool
}

// GPU is one GPU of a node with what is reserved on it.
type GPU struct {
	Info api.GPU
	// MIG lists the reserved MIG instances (mig GPUs).
	MIG []Instance
	// Shares lists the hami-core shares handed out (hami-core GPUs).
	Shares []Share
}

// Instance is a reserved MIG instance.
type Instance struct {
	Profile   string
	Placement api.Placement
}

// Share is a hami-core share.
type Share struct {
	MemoryMiB, Cores int
}

// Assignment is the device chosen for one requested device.
type Assignment struct {
	ContainerIndex, DeviceIndex int
	// GPU indexes the node's GPUs.
	GPU     int
	GPUUUID string
	Mode    string
	// Profile and Placement: MIG only.
	Profile   string
	Placement api.Placement
	// MemoryMiB and Cores: the share (hami-core) or the profile's (MIG).
	MemoryMiB, Cores int
}

// Result is a pod's fit on a node.
type Result struct {
	Mode        string
	Assignments []Assignment
	// Cost is the summed fragmentation cost of the MIG placements.
	Cost int
	// Utilisation is the mean utilisation, after placement, of the GPUs used, in [0,1].
	Utilisation float64
}

// Refusal says why a pod does not fit a node.
type Refusal struct {
	Reason Reason
	// Detail names the container, device and GPU.
	Detail string
}

func (r *Refusal) Error() string { return string(r.Reason) + ": " + r.Detail }

// Fit places every requested device of the pod on the node's GPUs, all of them disjoint,
// or returns why it cannot. gpus is not modified.
func Fit(gpus []GPU, req *Request, opts Options) (*Result, *Refusal) {
	if !req.NUMABind {
		return fitPools(gpus, req, opts, anyNUMA)
	}
	return fitOneNUMA(gpus, req, opts)
}

// anyNUMA places devices on GPUs of any NUMA node.
const anyNUMA = -1

// fitOneNUMA places the pod on the GPUs of each NUMA node of the node in turn and keeps the
// best fit (the least fragmentation cost, then the fuller GPUs, then the lower NUMA node).
// When none fits but the node does across NUMA nodes, the pod is refused for the binding;
// otherwise for what keeps it off the node anyway.
func fitOneNUMA(gpus []GPU, req *Request, opts Options) (*Result, *Refusal) {
	var numas []int
	for i := range gpus {
		if !slices.Contains(numas, gpus[i].Info.Numa) {
			numas = append(numas, gpus[i].Info.Numa)
		}
	}
	slices.Sort(numas)
	var best *Result
	for _, n := range numas {
		res, refusal := fitPools(gpus, req, opts, n)
		if refusal != nil {
			continue
		}
		if best == nil || res.Cost < best.Cost || res.Cost == best.Cost && res.Utilisation > best.Utilisation {
			best = res
		}
	}
	if best != nil {
		return best, nil
	}
	if _, refusal := fitPools(gpus, req, opts, anyNUMA); refusal != nil {
		return nil, refusal
	}
	return nil, &Refusal{Reason: ReasonNUMA, Detail: fmt.Sprintf("the pod's %d devices fit the node's GPUs, but not those of one NUMA node (%s: true; NUMA nodes %v)",
		req.devices(), api.NUMABindAnnotation, numas)}
}

// devices is the number of devices the request asks for.
func (r *Request) devices() int {
	n := 0
	for _, c := range r.Containers {
		n += c.Devices
	}
	return n
}

// fitPools places the pod in the pools its mode allows, on the GPUs of NUMA node numa
// (anyNUMA: all).
func fitPools(gpus []GPU, req *Request, opts Options, numa int) (*Result, *Refusal) {
	var pools []string
	switch req.Mode {
	case api.ModeMIG, api.ModeHAMiCore:
		pools = []string{req.Mode}
	default:
		pools = []string{api.ModeMIG, api.ModeHAMiCore}
	}
	var best *Result
	var why refusal
	for _, pool := range pools {
		var res *Result
		var r refusal
		if pool == api.ModeMIG {
			res, r = fitMIG(gpus, req, opts, numa)
		} else {
			res, r = fitHAMiCore(gpus, req, opts, numa)
		}
		if res == nil {
			why = why.closer(r)
			continue
		}
		// Either pool: the fuller GPUs win (binpack across pools); MIG on a tie.
		if best == nil || res.Utilisation > best.Utilisation {
			best = res
		}
	}
	if best == nil {
		return nil, &Refusal{Reason: why.reason, Detail: why.detail}
	}
	return best, nil
}

// eligible filters GPUs by mode, health, the pod's type and UUID selectors, and NUMA node
// (anyNUMA: every one).
func eligible(g *GPU, mode string, req *Request, numa int) refusal {
	info := &g.Info
	if numa != anyNUMA && info.Numa != numa {
		return refusal{reason: ReasonNoGPU, detail: fmt.Sprintf("%s is on NUMA node %d", info.ID, info.Numa)}
	}
	if info.Mode != mode {
		return refusal{reason: ReasonNoGPU, detail: fmt.Sprintf("%s is a %s GPU", info.ID, info.Mode)}
	}
	if !info.Health {
		return refusal{reason: ReasonNoGPU, detail: fmt.Sprintf("%s is unhealthy", info.ID)}
	}
	var typ string // lower-cased only where the pod selects by type
	matchesType := func(s string) bool {
		if typ == "" {
			typ = strings.ToLower(info.Type)
		}
		return strings.Contains(typ, s)
	}
	switch {
	case len(req.UseTypes) > 0 && !slices.ContainsFunc(req.UseTypes, matchesType),
		slices.ContainsFunc(req.NoUseTypes, matchesType),
		len(req.UseUUIDs) > 0 && !sortedContains(req.UseUUIDs, info.ID),
		sortedContains(req.NoUseUUIDs, info.ID):
		return refusal{reason: ReasonNotSelected, detail: fmt.Sprintf("%s (%s) is excluded by the pod's GPU type or UUID annotations", info.ID, info.Type)}
	}
	if info.Unusable != "" {
		return refusal{reason: ReasonUnusable, detail: fmt.Sprintf("%s (%s, %s): %s", info.ID, info.Type, info.Mode, info.Unusable)}
	}
	if mode == api.ModeMIG && len(info.MigProfiles) == 0 {
		return refusal{reason: ReasonNoMIGGPU, detail: fmt.Sprintf("%s publishes no MIG profile (MIG mode off, or no allowlist entry for %s)", info.ID, info.Type)}
	}
	return refusal{}
}

func sortedContains(sorted []string, s string) bool {
	_, found := slices.BinarySearch(sorted, s)
	return found
}

func policyFor(req *Request, poolDefault string) string {
	if req.GPUPolicy != "" {
		return req.GPUPolicy
	}
	return poolDefault
}

// migCandidate is the best choice for one device on one GPU.
type migCandidate struct {
	gpu    int
	choice migChoice
	memory int
	util   float64
}

func fitMIG(gpus []GPU, req *Request, opts Options, numa int) (*Result, refusal) {
	type state struct {
		g *migGPU
		u migUsage
	}
	states := make([]*state, len(gpus))
	var why refusal
	for i := range gpus {
		if r := eligible(&gpus[i], api.ModeMIG, req, numa); r.reason != ReasonNone {
			why = why.closer(r)
			continue
		}
		s := &state{g: preparedMIGGPU(&gpus[i].Info)}
		for _, inst := range gpus[i].MIG {
			s.g.add(&s.u, inst.Profile, inst.Placement)
		}
		states[i] = s
	}
	if !slices.ContainsFunc(states, func(s *state) bool { return s != nil }) {
		if why.reason == ReasonNone || why.reason == ReasonNoGPU {
			why = refusal{reason: ReasonNoMIGGPU, detail: "the node has no healthy MIG GPU"}
		}
		return nil, why
	}
	spread := policyFor(req, opts.MIGPolicy) == api.PolicySpread
	res := &Result{Mode: api.ModeMIG}
	for _, c := range req.Containers {
		for d := 0; d < c.Devices; d++ {
			var best *migCandidate
			var deviceWhy refusal
			for i, s := range states {
				if s == nil {
					continue
				}
				choice, r := s.g.choose(&s.u, migDemandOf(c, s.g, opts), opts.FragmentationAware, false)
				if r.reason != ReasonNone {
					deviceWhy = deviceWhy.closer(r)
					continue
				}
				cand := &migCandidate{gpu: i, choice: choice, memory: s.g.profiles[choice.profile].pub.MemoryMB, util: s.g.utilisation(&s.u)}
				if best == nil || betterMIG(cand, best, spread) {
					best = cand
				}
			}
			if best == nil && opts.Terse {
				return nil, deviceWhy
			}
			if best == nil {
				// The failure path: ask every GPU again, this time for its details.
				deviceWhy = refusal{}
				for i, s := range states {
					if s == nil {
						continue
					}
					_, r := s.g.choose(&s.u, migDemandOf(c, s.g, opts), opts.FragmentationAware, true)
					deviceWhy = deviceWhy.closer(refusal{reason: r.reason, detail: gpus[i].Info.ID + ": " + r.detail})
				}
				deviceWhy.detail = fmt.Sprintf("container %d device %d: %s", c.Index, d, deviceWhy.detail)
				return nil, deviceWhy
			}
			s := states[best.gpu]
			p := &s.g.profiles[best.choice.profile]
			pl := p.pub.Placements[placementIndex(p, best.choice.placement)]
			s.g.add(&s.u, p.pub.Name, pl)
			res.Cost += best.choice.cost
			res.Assignments = append(res.Assignments, Assignment{
				ContainerIndex: c.Index, DeviceIndex: d, GPU: best.gpu, GPUUUID: gpus[best.gpu].Info.ID, Mode: api.ModeMIG,
				Profile: p.pub.Name, Placement: pl, MemoryMiB: p.pub.MemoryMB, Cores: p.pub.Core,
			})
		}
	}
	res.Utilisation = meanUtilisation(res.Assignments, func(i int) float64 { return states[i].g.utilisation(&states[i].u) })
	return res, refusal{}
}

// placementIndex maps a mask index back to the published placement: masks skip placements
// outside the GPU's slots, which the inventory decoder already refuses.
func placementIndex(p *migProfile, maskIndex int) int {
	m := p.masks[maskIndex]
	for i, pl := range p.pub.Placements {
		if maskOf(pl) == m {
			return i
		}
	}
	return maskIndex
}

// betterMIG orders candidates: the smaller profile (less memory wasted), then by policy:
// spread takes the emptier GPU first; binpack the lower fragmentation cost, then the fuller
// GPU; then the lower GPU index.
func betterMIG(a, b *migCandidate, spread bool) bool {
	if a.memory != b.memory {
		return a.memory < b.memory
	}
	if spread && a.util != b.util {
		return a.util < b.util
	}
	if a.choice.cost != b.choice.cost {
		return a.choice.cost < b.choice.cost
	}
	if !spread && a.util != b.util {
		return a.util > b.util
	}
	return a.gpu < b.gpu
}

// deviceCores is the cores percentage a device needs: the container's, else the device
// config's defaultCores (HAMi's default for a request that names no gpucores).
func deviceCores(c ContainerRequest, defaultCores int) int {
	if c.Cores > 0 {
		return c.Cores
	}
	return defaultCores
}

// migDemandOf is what one device of c needs of the MIG GPU g. A memory percentage (without
// gpumem, which wins) asks for that share of the GPU (shareDemand), not of the full profile's
// MiB as HAMi v2.10 reads it: there 50 % of an A100-40GB's 40,192 MiB is just above the
// 19,968 MiB of the 20 GB profiles and takes the whole GPU.
func migDemandOf(c ContainerRequest, g *migGPU, opts Options) migDemand {
	cores := deviceCores(c, opts.DefaultCores)
	if c.MemoryMiB == 0 && c.MemoryPercent > 0 {
		return g.shareDemand(c.MemoryPercent, cores)
	}
	return migDemand{memoryMiB: deviceMemory(c, g.fullMemory(), opts.DefaultMemory), cores: cores}
}

// deviceMemory resolves a device's memory against a device of deviceMiB.
func deviceMemory(c ContainerRequest, deviceMiB, defaultMemory int) int {
	switch {
	case c.MemoryMiB > 0:
		return c.MemoryMiB
	case c.MemoryPercent > 0:
		return (c.MemoryPercent*deviceMiB + 99) / 100
	case defaultMemory > 0:
		return defaultMemory
	}
	return deviceMiB
}

func fitHAMiCore(gpus []GPU, req *Request, opts Options, numa int) (*Result, refusal) {
	usage := make([]*coreUsage, len(gpus))
	var why refusal
	for i := range gpus {
		if r := eligible(&gpus[i], api.ModeHAMiCore, req, numa); r.reason != ReasonNone {
			why = why.closer(r)
			continue
		}
		u := &coreUsage{}
		for _, s := range gpus[i].Shares {
			u.add(s, gpus[i].Info.Devcore)
		}
		usage[i] = u
	}
	if !slices.ContainsFunc(usage, func(u *coreUsage) bool { return u != nil }) {
		if why.reason == ReasonNone {
			why = refusal{reason: ReasonNoGPU, detail: "the node has no hami-core GPU"}
		}
		return nil, why
	}
	spread := policyFor(req, opts.HAMiCorePolicy) != api.PolicyBinpack
	res := &Result{Mode: api.ModeHAMiCore}
	for _, c := range req.Containers {
		// HAMi's order: scores before this container, spread lowest first, binpack highest;
		// full ties to the highest index.
		order := make([]int, 0, len(gpus))
		for i, u := range usage {
			if u != nil {
				order = append(order, i)
			}
		}
		scores := make(map[int]float64, len(order))
		for _, i := range order {
			scores[i] = hamiScore(&gpus[i], usage[i])
		}
		sort.SliceStable(order, func(a, b int) bool {
			sa, sb := scores[order[a]], scores[order[b]]
			if sa != sb {
				return (sa < sb) == spread
			}
			return order[a] > order[b]
		})
		used := map[int]bool{} // a container's devices are distinct GPUs
		for d := 0; d < c.Devices; d++ {
			placed := false
			var deviceWhy refusal
			for _, i := range order {
				if used[i] {
					continue
				}
				mem, cores := deviceMemory(c, gpus[i].Info.Devmem, opts.DefaultMemory), deviceCores(c, opts.DefaultCores)
				if r := fitShare(&gpus[i], usage[i], mem, cores); r.reason != ReasonNone {
					deviceWhy = deviceWhy.closer(refusal{reason: r.reason, detail: gpus[i].Info.ID + ": " + r.detail})
					continue
				}
				usage[i].add(Share{MemoryMiB: mem, Cores: cores}, gpus[i].Info.Devcore)
				used[i] = true
				res.Assignments = append(res.Assignments, Assignment{
					ContainerIndex: c.Index, DeviceIndex: d, GPU: i, GPUUUID: gpus[i].Info.ID, Mode: api.ModeHAMiCore,
					MemoryMiB: mem, Cores: cores,
				})
				placed = true
				break
			}
			if !placed {
				if deviceWhy.reason == ReasonNone {
					deviceWhy = refusal{reason: ReasonShareLimit, detail: fmt.Sprintf("the container asks for %d distinct GPUs and fewer fit", c.Devices)}
				}
				deviceWhy.detail = fmt.Sprintf("container %d device %d: %s", c.Index, d, deviceWhy.detail)
				return nil, deviceWhy
			}
		}
	}
	res.Utilisation = meanUtilisation(res.Assignments, func(i int) float64 {
		return hamiScore(&gpus[i], usage[i]) / 30
	})
	return res, refusal{}
}

func meanUtilisation(as []Assignment, util func(gpu int) float64) float64 {
	seen := map[int]bool{}
	total := 0.0
	for _, a := range as {
		if !seen[a.GPU] {
			seen[a.GPU] = true
			total += util(a.GPU)
		}
	}
	if len(seen) == 0 {
		return 0
	}
	return total / float64(len(seen))
}

// InUse says whether any of the node's GPUs has an instance or a share on it.
func InUse(gpus []GPU) bool {
	return slices.ContainsFunc(gpus, func(g GPU) bool { return len(g.MIG) > 0 || len(g.Shares) > 0 })
}

// NodeUtilisation is the node's GPU occupancy once the fit is placed, in [0,1]: per GPU the
// share of memory slots in use (MIG) or of shares, cores and memory (hami-core), averaged.
func NodeUtilisation(gpus []GPU, res *Result) float64 {
	if len(gpus) == 0 {
		return 0
	}
	total := 0.0
	for i := range gpus {
		g := &gpus[i]
		if g.Info.Mode == api.ModeMIG {
			var used slotMask
			for _, in := range g.MIG {
				used |= maskOf(in.Placement)
			}
			for _, a := range res.Assignments {
				if a.GPU == i && a.Mode == api.ModeMIG {
					used |= maskOf(a.Placement)
				}
			}
			if slots := g.Info.SlotCount(); slots > 0 {
				total += float64(bits.OnesCount32(uint32(used))) / float64(slots)
			}
			continue
		}
		u := &coreUsage{}
		for _, s := range g.Shares {
			u.add(s, g.Info.Devcore)
		}
		for _, a := range res.Assignments {
			if a.GPU == i && a.Mode == api.ModeHAMiCore {
				u.add(Share{MemoryMiB: a.MemoryMiB, Cores: a.Cores}, g.Info.Devcore)
			}
		}
		total += hamiScore(g, u) / 30
	}
	return total / float64(len(gpus))
}
