package packing

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/inventory"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// GPUsPerNode is the size of every full node of a simulated cluster.
const GPUsPerNode = 8

// Cluster is a set of identical MIG GPUs of one model, GPUsPerNode to a node, each node's
// inventory as the device plugin's own inventory code publishes it.
type Cluster struct {
	Model *config.Model
	// AllProfiles: every profile of the model is allowlisted; else HAMi's default allowlist.
	AllProfiles bool
	Nodes       [][]api.GPU
	// FullMiB is the full-GPU profile's memory, the base of gpu_milli.
	FullMiB int
	Slots   int
	// profiles are the published profiles sorted by memory, then slice count.
	profiles []api.MigProfile
}

// Label names the cluster's model and allowlist.
func (c *Cluster) Label() string {
	if c.AllProfiles {
		return c.Model.Key + " (all profiles)"
	}
	return c.Model.Key
}

// GPUs is the number of GPUs.
func (c *Cluster) GPUs() int {
	n := 0
	for _, node := range c.Nodes {
		n += len(node)
	}
	return n
}

// Capacity is the number of memory slots of the cluster.
func (c *Cluster) Capacity() int { return c.GPUs() * c.Slots }

// NewCluster builds gpus GPUs of the model (a key of config.Models), the last node
// holding what is left over GPUsPerNode.
func NewCluster(modelKey string, gpus int, allProfiles bool) (*Cluster, error) {
	m, ok := config.LookupModel(modelKey)
	if !ok {
		return nil, fmt.Errorf("unknown GPU model %q", modelKey)
	}
	full := m.FullProfile()
	if full == nil {
		return nil, fmt.Errorf("%s has no full-GPU profile", m.Key)
	}
	c := &Cluster{Model: m, AllProfiles: allProfiles, FullMiB: full.MemoryMiB, Slots: m.Slots}
	for n := 0; gpus > 0; n++ {
		k := min(gpus, GPUsPerNode)
		gpus -= k
		name := fmt.Sprintf("node-%03d", n)
		inv, err := nodeInventory(m, name, k, allProfiles)
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, inv)
	}
	if len(c.Nodes) == 0 {
		return nil, fmt.Errorf("a cluster needs at least one GPU")
	}
	c.profiles = slices.Clone(c.Nodes[0][0].MigProfiles)
	slices.SortStableFunc(c.profiles, func(a, b api.MigProfile) int {
		return cmp.Or(cmp.Compare(a.MemoryMB, b.MemoryMB), cmp.Compare(a.SliceCount, b.SliceCount))
	})
	return c, nil
}

// nodeInventory is what the device plugin on a mig node publishes for k simulated GPUs.
func nodeInventory(m *config.Model, node string, k int, allProfiles bool) ([]api.GPU, error) {
	doc := fmt.Sprintf("nodeconfig:\n- name: %s\n  operatingmode: %s\n", node, api.ModeMIG)
	if allProfiles {
		doc += fmt.Sprintf("nvidia:\n  migProfileAllowlist:\n  - models: [%s]\n    profiles: [%s]\n", m.Key, strings.Join(m.ProfileNames(), ", "))
	}
	cfg, err := config.ParseDeviceConfig([]byte(doc))
	if err != nil {
		return nil, err
	}
	specs := make([]sim.GPUSpec, k)
	for i := range specs {
		specs[i] = sim.GPUSpec{Model: m.Key}
	}
	s, err := sim.New(sim.Options{Seed: node}, specs...)
	if err != nil {
		return nil, err
	}
	if err := s.Init(); err != nil {
		return nil, err
	}
	res, err := inventory.Discover(context.Background(), s, cfg, node)
	if err != nil {
		return nil, err
	}
	for i, g := range res.GPUs {
		if g.Mode != api.ModeMIG || !g.Health || len(g.MigProfiles) == 0 {
			return nil, fmt.Errorf("%s GPU %d is not a healthy MIG GPU with profiles: %+v", node, i, g)
		}
	}
	return res.GPUs, nil
}

// Demand is one pod's GPU request: Devices devices of MemoryMiB each (0: the full GPU).
type Demand struct {
	Devices   int
	MemoryMiB int
}

// Demand maps a trace pod onto the cluster's model: a fractional pod asks for one device of
// ceil(gpu_milli/1000 × the full-GPU profile's memory) MiB, the others for whole devices.
func (c *Cluster) Demand(p Pod) Demand {
	if p.Whole() || p.Milli == 0 {
		return Demand{Devices: p.Devices}
	}
	return Demand{Devices: 1, MemoryMiB: int(math.Ceil(float64(p.Milli) * float64(c.FullMiB) / 1000))}
}

// memory resolves a demand's per-device memory (0 is the full-GPU profile's).
func (c *Cluster) memory(d Demand) int {
	if d.MemoryMiB == 0 {
		return c.FullMiB
	}
	return d.MemoryMiB
}

// ProfileSlots is the slot count of the smallest published profile (by memory, then
// slices) that holds one device of the demand, 0 if none does.
func (c *Cluster) ProfileSlots(d Demand) int {
	if k := c.profileIndex(d); k >= 0 {
		return c.profiles[k].Placements[0].Size
	}
	return 0
}

// Alloc is one device placed: a MIG instance on a GPU of a node.
type Alloc struct {
	Node, GPU int
	Profile   string
	Placement api.Placement
}

// State is one policy's view of the cluster: the reservations on every GPU.
type State struct {
	C     *Cluster
	Nodes [][]placement.GPU
}

// NewState is the empty cluster.
func NewState(c *Cluster) *State {
	st := &State{C: c, Nodes: make([][]placement.GPU, len(c.Nodes))}
	for n, node := range c.Nodes {
		st.Nodes[n] = make([]placement.GPU, len(node))
		for i := range node {
			st.Nodes[n][i].Info = node[i]
		}
	}
	return st
}

// Apply reserves the allocations.
func (st *State) Apply(as []Alloc) {
	for _, a := range as {
		g := &st.Nodes[a.Node][a.GPU]
		g.MIG = append(g.MIG, placement.Instance{Profile: a.Profile, Placement: a.Placement})
	}
}

// Release frees the allocations.
func (st *State) Release(as []Alloc) {
	for _, a := range as {
		g := &st.Nodes[a.Node][a.GPU]
		i := slices.Index(g.MIG, placement.Instance{Profile: a.Profile, Placement: a.Placement})
		if i < 0 {
			panic(fmt.Sprintf("releasing %+v, which is not reserved", a))
		}
		g.MIG = slices.Delete(g.MIG, i, i+1)
	}
}

// usedMask is the set of reserved slots of a GPU.
func usedMask(g *placement.GPU) uint32 {
	var m uint32
	for _, in := range g.MIG {
		m |= mask(in.Placement)
	}
	return m
}

func mask(p api.Placement) uint32 { return (uint32(1)<<uint(p.Size) - 1) << uint(p.Start) }

// UsedSlots is the number of reserved slots in the cluster.
func (st *State) UsedSlots() int {
	n := 0
	for _, node := range st.Nodes {
		for i := range node {
			n += bits.OnesCount32(usedMask(&node[i]))
		}
	}
	return n
}

// FragmentedRefusal reports whether a refused demand would have found room by slot count
// alone: some node's GPUs have, each counted in whole units of the demand's smallest
// profile, free slots for all its devices — so only placement rules or fragmentation
// refused it.
func (st *State) FragmentedRefusal(d Demand) bool {
	size := st.C.ProfileSlots(d)
	if size == 0 {
		return false
	}
	for _, node := range st.Nodes {
		units := 0
		for i := range node {
			units += (st.C.Slots - bits.OnesCount32(usedMask(&node[i]))) / size
		}
		if units >= d.Devices {
			return true
		}
	}
	return false
}

// Check verifies every reservation: a published profile at one of its legal placements,
// no two overlapping, at most the profile's instance count and the GPU's device count.
func (st *State) Check() error {
	for n, node := range st.Nodes {
		for i := range node {
			g := &node[i]
			var used uint32
			count := map[string]int{}
			for _, in := range g.MIG {
				k := slices.IndexFunc(g.Info.MigProfiles, func(p api.MigProfile) bool { return p.Name == in.Profile })
				if k < 0 {
					return fmt.Errorf("node %d GPU %d: %s is not published", n, i, in.Profile)
				}
				p := &g.Info.MigProfiles[k]
				if !slices.Contains(p.Placements, in.Placement) {
					return fmt.Errorf("node %d GPU %d: %s at %+v is not a legal placement", n, i, in.Profile, in.Placement)
				}
				if m := mask(in.Placement); used&m != 0 {
					return fmt.Errorf("node %d GPU %d: %s at %+v overlaps another instance", n, i, in.Profile, in.Placement)
				} else {
					used |= m
				}
				count[in.Profile]++
				if p.Instances > 0 && count[in.Profile] > p.Instances {
					return fmt.Errorf("node %d GPU %d: %d instances of %s, at most %d", n, i, count[in.Profile], in.Profile, p.Instances)
				}
			}
			if g.Info.Count > 0 && len(g.MIG) > g.Info.Count {
				return fmt.Errorf("node %d GPU %d: %d instances, at most %d", n, i, len(g.MIG), g.Info.Count)
			}
		}
	}
	return nil
}
