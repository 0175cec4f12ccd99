package gonvml

import (
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

// gpuInstance is one GPU instance of a device.
type gpuInstance struct {
	d  *device
	gi gonvml.GpuInstance
}

// ref names the GI in errors; it asks NVML for the id and does without if that fails.
func (g *gpuInstance) ref() string {
	if info, ret := g.gi.GetInfo(); ret == gonvml.SUCCESS {
		return fmt.Sprintf("%s GI %d", g.d.name(), info.Id)
	}
	return g.d.name() + " GI ?"
}

func (g *gpuInstance) Info() (nvml.GpuInstanceInfo, error) {
	info, ret := g.gi.GetInfo()
	if err := toError(ret, fmt.Sprintf("GpuInstanceGetInfo(%s)", g.d.name())); err != nil {
		return nvml.GpuInstanceInfo{}, err
	}
	return nvml.GpuInstanceInfo{
		ID:        int(info.Id),
		ProfileID: int(info.ProfileId),
		Placement: api.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)},
	}, nil
}

func (g *gpuInstance) Destroy() error {
	op := fmt.Sprintf("GpuInstanceDestroy(%s)", g.ref())
	return toError(g.gi.Destroy(), op)
}

// computeInstanceProfileCandidates lists, in the order to try them, the
// COMPUTE_INSTANCE_PROFILE_* indexes for the default CI spanning a GI of sliceCount compute
// slices read at GPU_INSTANCE_PROFILE_* index giProfileIndex. The double-memory 1g
// (1_SLICE_REV2) takes 1_SLICE_REV1 on Hopper and Blackwell; the other 1-slice GIs take
// 1_SLICE and fall back to 1_SLICE_REV1 where a GPU lacks it. Nil for an unknown slice count.
func computeInstanceProfileCandidates(sliceCount, giProfileIndex int) []int {
	switch sliceCount {
	case 1:
		if giProfileIndex == gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2 {
			return []int{gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}
		}
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1}
	case 2:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}
	case 3:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE}
	case 4:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE}
	case 6:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_6_SLICE}
	case 7:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}
	case 8:
		return []int{gonvml.COMPUTE_INSTANCE_PROFILE_8_SLICE}
	}
	return nil
}

// CreateComputeInstance creates the GI's default CI: the CI profile covering all its slices,
// with shared engines.
func (g *gpuInstance) CreateComputeInstance() (nvml.ComputeInstance, error) {
	gii, ret := g.gi.GetInfo()
	if err := toError(ret, fmt.Sprintf("CreateComputeInstance(%s): GpuInstanceGetInfo", g.d.name())); err != nil {
		return nil, err
	}
	op := fmt.Sprintf("CreateComputeInstance(%s GI %d)", g.d.name(), gii.Id)
	p, err := g.d.profileByID(int(gii.ProfileId), op)
	if err != nil {
		return nil, err
	}
	candidates := computeInstanceProfileCandidates(int(p.info.SliceCount), p.index)
	if len(candidates) == 0 {
		return nil, nvml.Errorf(nvml.ErrorNotSupported, op, "no compute-instance profile for a %d-slice GPU instance", p.info.SliceCount)
	}
	var tried []string
	for _, ciIndex := range candidates {
		ciInfo, ret := g.gi.GetComputeInstanceProfileInfo(ciIndex, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if absent(ret) {
			tried = append(tried, fmt.Sprintf("CI profile index %d: %s", ciIndex, nvml.Return(ret)))
			continue
		}
		if err := toError(ret, fmt.Sprintf("%s: GetComputeInstanceProfileInfo(index %d)", op, ciIndex)); err != nil {
			return nil, err
		}
		ci, ret := g.gi.CreateComputeInstance(&ciInfo)
		if err := toError(ret, fmt.Sprintf("%s: CI profile %d", op, ciInfo.Id)); err != nil {
			return nil, err
		}
		return &computeInstance{g: g, ci: ci}, nil
	}
	return nil, nvml.Errorf(nvml.ErrorNotSupported, op, "no compute-instance profile for GI profile %d: %s", gii.ProfileId, strings.Join(tried, "; "))
}

// ComputeInstances lists the GI's CIs of every CI profile, sorted by CI id.
func (g *gpuInstance) ComputeInstances() ([]nvml.ComputeInstance, error) {
	type listed struct {
		id int
		ci *computeInstance
	}
	var all []listed
	seenProfile := map[uint32]bool{}
	for ciIndex := 0; ciIndex < gonvml.COMPUTE_INSTANCE_PROFILE_COUNT; ciIndex++ {
		ciInfo, ret := g.gi.GetComputeInstanceProfileInfo(ciIndex, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if absent(ret) {
			continue
		}
		if err := toError(ret, fmt.Sprintf("GetComputeInstanceProfileInfo(%s, index %d)", g.ref(), ciIndex)); err != nil {
			return nil, err
		}
		// Two indexes can name one profile; go-nvml rejects an InstanceCount of 0.
		if seenProfile[ciInfo.Id] || ciInfo.InstanceCount == 0 {
			continue
		}
		seenProfile[ciInfo.Id] = true
		cis, ret := g.gi.GetComputeInstances(&ciInfo)
		if absent(ret) {
			continue
		}
		if err := toError(ret, fmt.Sprintf("GetComputeInstances(%s, CI profile %d)", g.ref(), ciInfo.Id)); err != nil {
			return nil, err
		}
		for _, ci := range cis {
			cii, ret := ci.GetInfo()
			if err := toError(ret, fmt.Sprintf("ComputeInstanceGetInfo(%s, CI profile %d)", g.ref(), ciInfo.Id)); err != nil {
				return nil, err
			}
			all = append(all, listed{int(cii.Id), &computeInstance{g: g, ci: ci}})
		}
	}
	sortBy(all, func(l listed) int { return l.id })
	out := make([]nvml.ComputeInstance, len(all))
	for i, l := range all {
		out[i] = l.ci
	}
	return out, nil
}

// computeInstance is one CI inside a GI.
type computeInstance struct {
	g  *gpuInstance
	ci gonvml.ComputeInstance
}

func (c *computeInstance) Info() (nvml.ComputeInstanceInfo, error) {
	info, ret := c.ci.GetInfo()
	if err := toError(ret, fmt.Sprintf("ComputeInstanceGetInfo(%s)", c.g.ref())); err != nil {
		return nvml.ComputeInstanceInfo{}, err
	}
	gii, ret := c.g.gi.GetInfo()
	if err := toError(ret, fmt.Sprintf("GpuInstanceGetInfo(%s)", c.g.d.name())); err != nil {
		return nvml.ComputeInstanceInfo{}, err
	}
	return nvml.ComputeInstanceInfo{ID: int(info.Id), ProfileID: int(info.ProfileId), GpuInstanceID: int(gii.Id)}, nil
}

func (c *computeInstance) Destroy() error {
	op := fmt.Sprintf("ComputeInstanceDestroy(%s CI ?)", c.g.ref())
	if info, ret := c.ci.GetInfo(); ret == gonvml.SUCCESS {
		op = fmt.Sprintf("ComputeInstanceDestroy(%s CI %d)", c.g.ref(), info.Id)
	}
	return toError(c.ci.Destroy(), op)
}
