package gonvml

import (
	"fmt"
	"math"
	"sort"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
)

// profile is one GPU-instance profile as NVML reported it.
type profile struct {
	// index is the GPU_INSTANCE_PROFILE_* index it was read at; only discovery and the
	// compute-instance choice use it, every other call takes info.Id.
	index int
	// info is what later calls (placements, create, list) are given: NVML's own answer.
	info gonvml.GpuInstanceProfileInfo
	pub  nvml.GpuInstanceProfile
}

// namedProfileInfoFunc reads GPU-instance profile `index` with a versioned info struct that
// carries the profile's name. It returns ARGUMENT_VERSION_MISMATCH or NOT_SUPPORTED when the
// driver has no such call, and the caller then falls back to the unversioned (V1) call.
type namedProfileInfoFunc func(dev gonvml.Device, index int) (gonvml.GpuInstanceProfileInfo, string, gonvml.Return)

// realNamedProfileInfo tries the v3 struct, then v2 (both carry a name; v3 is R525+).
func (b *backend) realNamedProfileInfo(dev gonvml.Device, index int) (gonvml.GpuInstanceProfileInfo, string, gonvml.Return) {
	if !b.hasSymbol("nvmlDeviceGetGpuInstanceProfileInfoV") {
		return gonvml.GpuInstanceProfileInfo{}, "", gonvml.ERROR_NOT_SUPPORTED
	}
	h := dev.GetGpuInstanceProfileInfoV(index)
	v3, ret := h.V3()
	if ret == gonvml.SUCCESS {
		return gonvml.GpuInstanceProfileInfo{
			Id:                  v3.Id,
			IsP2pSupported:      v3.Capabilities & gonvml.GPU_INSTANCE_PROFILE_CAPS_P2P,
			SliceCount:          v3.SliceCount,
			InstanceCount:       v3.InstanceCount,
			MultiprocessorCount: v3.MultiprocessorCount,
			CopyEngineCount:     v3.CopyEngineCount,
			DecoderCount:        v3.DecoderCount,
			EncoderCount:        v3.EncoderCount,
			JpegCount:           v3.JpegCount,
			OfaCount:            v3.OfaCount,
			MemorySizeMB:        v3.MemorySizeMB,
		}, cString(v3.Name[:]), ret
	}
	if ret != gonvml.ERROR_ARGUMENT_VERSION_MISMATCH {
		return gonvml.GpuInstanceProfileInfo{}, "", ret
	}
	v2, ret := h.V2()
	if ret != gonvml.SUCCESS {
		return gonvml.GpuInstanceProfileInfo{}, "", ret
	}
	return gonvml.GpuInstanceProfileInfo{
		Id:                  v2.Id,
		IsP2pSupported:      v2.IsP2pSupported,
		SliceCount:          v2.SliceCount,
		InstanceCount:       v2.InstanceCount,
		MultiprocessorCount: v2.MultiprocessorCount,
		CopyEngineCount:     v2.CopyEngineCount,
		DecoderCount:        v2.DecoderCount,
		EncoderCount:        v2.EncoderCount,
		JpegCount:           v2.JpegCount,
		OfaCount:            v2.OfaCount,
		MemorySizeMB:        v2.MemorySizeMB,
	}, cString(v2.Name[:]), ret
}

func (d *device) GpuInstanceProfiles() ([]nvml.GpuInstanceProfile, error) {
	profiles, err := d.gpuInstanceProfiles()
	if err != nil {
		return nil, err
	}
	out := make([]nvml.GpuInstanceProfile, len(profiles))
	for i, p := range profiles {
		out[i] = p.pub
	}
	return out, nil
}

func (d *device) GpuInstanceProfileByID(profileID int) (nvml.GpuInstanceProfile, error) {
	p, err := d.profileByID(profileID, d.op("GpuInstanceProfileByID", fmt.Sprintf("profile %d", profileID)))
	if err != nil {
		return nvml.GpuInstanceProfile{}, err
	}
	return p.pub, nil
}

// profileByID finds a profile by its NVML id, the only key the driver's later calls honour
// (the index it was read at is not it: on A100 index 9, 1_SLICE_REV2, is id 15).
func (d *device) profileByID(profileID int, op string) (profile, error) {
	profiles, err := d.gpuInstanceProfiles()
	if err != nil {
		return profile{}, err
	}
	for _, p := range profiles {
		if int(p.info.Id) == profileID {
			return p, nil
		}
	}
	if len(profiles) == 0 {
		return profile{}, nvml.Errorf(nvml.ErrorNotSupported, op, "the GPU reports no GPU-instance profiles; is MIG mode enabled?")
	}
	ids := make([]string, len(profiles))
	for i, p := range profiles {
		ids[i] = fmt.Sprintf("%d (%s)", p.info.Id, p.pub.Name)
	}
	return profile{}, nvml.Errorf(nvml.ErrorInvalidArgument, op, "no GPU-instance profile with id %d; the GPU has %s", profileID, strings.Join(ids, ", "))
}

// gpuInstanceProfiles reads every GPU_INSTANCE_PROFILE_* index, in index order, skipping the
// ones the GPU does not have.
func (d *device) gpuInstanceProfiles() ([]profile, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.profiles != nil {
		return d.profiles, nil
	}
	var out []profile
	seen := map[uint32]bool{}
	deviceName := "" // fetched only if a profile comes without a name
	for index := 0; index < gonvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		info, name, ret := d.b.profileInfo(d.dev, index)
		if ret == gonvml.ERROR_ARGUMENT_VERSION_MISMATCH || ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_FUNCTION_NOT_FOUND {
			info, ret = d.dev.GetGpuInstanceProfileInfo(index)
			name = ""
		}
		if absent(ret) {
			continue // the profile does not exist on this GPU
		}
		if err := toError(ret, d.op("GetGpuInstanceProfileInfo", fmt.Sprintf("index %d", index))); err != nil {
			return nil, err
		}
		if seen[info.Id] {
			continue // an index aliasing a profile already listed
		}
		seen[info.Id] = true
		memMiB := int(info.MemorySizeMB)
		if name == "" {
			if deviceName == "" {
				deviceName, _ = d.dev.GetName()
			}
			name = fallbackProfileName(deviceName, int(info.Id), int(info.SliceCount), memMiB)
		}
		out = append(out, profile{index: index, info: info, pub: nvml.GpuInstanceProfile{
			ID:            int(info.Id),
			Name:          name,
			SliceCount:    int(info.SliceCount),
			InstanceCount: int(info.InstanceCount),
			MemoryMiB:     memMiB,
			SMs:           int(info.MultiprocessorCount),
		}})
	}
	if len(out) > 0 {
		d.profiles = out
	}
	return out, nil
}

// fallbackProfileName names a profile for drivers whose profile info has no name: the
// built-in model table's name for that profile id on that GPU model.
func fallbackProfileName(deviceName string, id, slices, memMiB int) string {
	if m, ok := config.LookupModel(deviceName); ok {
		if p, ok := m.ProfileByID(id); ok {
			return p.Name
		}
	}
	// SYNTHESISED, not NVML's: a GPU or profile the table does not know. It follows NVML's
	// "<slices>g.<GB>gb" pattern but may differ from the real name (NVML calls A100-40GB's
	// 40192 MiB full profile 7g.40gb; this gives 7g.39gb), and it never carries a "+me"/"-me"
	// suffix.
	return fmt.Sprintf("%dg.%dgb", slices, int(math.Round(float64(memMiB)/1024)))
}

// sortBy sorts s stably by key.
func sortBy[T any](s []T, key func(T) int) {
	sort.SliceStable(s, func(i, j int) bool { return key(s[i]) < key(s[j]) })
}
