// Package inventory builds the node inventory (hami.io/node-nvidia-register) from NVML and
// the device config: which GPUs the node offers, in which mode, and for MIG GPUs the
// allowlisted profiles with their legal placements as NVML reports them.
package inventory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
)

// Result is what Discover found: the inventory to publish and the findings about it
// (a GPU left out, a MIG GPU without profiles), each saying why.
type Result struct {
	GPUs     []api.GPU
	Findings []string
}

// Discover reads every GPU through NVML and builds the node's inventory. A library that
// cannot be used is an error. A GPU that fails NVML's calls is published unhealthy (kubelet
// then sees its devices unhealthy), and a GPU that cannot do MIG on a mig node without
// profiles; each with a finding that says why.
func Discover(ctx context.Context, lib nvml.Interface, cfg *config.DeviceConfig, nodeName string) (*Result, error) {
	logger := klog.FromContext(ctx)
	node := cfg.Node(nodeName)
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, err
	}
	res := &Result{GPUs: []api.GPU{}}
	for i := 0; i < n; i++ {
		dev, err := lib.DeviceByIndex(i)
		if err != nil {
			if libraryError(err) {
				return nil, err
			}
			res.addFinding(logger, "GPU %d cannot be identified (%v): not published", i, err)
			continue
		}
		uuid, err := dev.UUID()
		if err != nil {
			if libraryError(err) {
				return nil, err
			}
			res.addFinding(logger, "GPU %d cannot be identified (%v): not published", i, err)
			continue
		}
		if node.FilterDevices.Excludes(uuid, i) {
			res.addFinding(logger, "GPU %d (%s) is excluded by nodeconfig %q filterdevices", i, uuid, node.Name)
			continue
		}
		gpu, err := describe(logger, res, dev, cfg, &node)
		if err != nil {
			if libraryError(err) {
				return nil, err
			}
			res.addFinding(logger, "GPU %d (%s) fails NVML calls (%v): published unhealthy", i, uuid, err)
			gpu = api.GPU{ID: uuid, Index: uint(i), Mode: cmpOr(node.OperatingMode, api.ModeHAMiCore), Count: 1, Health: false}
		}
		res.GPUs = append(res.GPUs, gpu)
	}
	return res, nil
}

// describe reads one GPU in its mode.
func describe(logger klog.Logger, res *Result, dev nvml.Device, cfg *config.DeviceConfig, node *config.NodeConfig) (api.GPU, error) {
	gpu, memoryMiB, err := describeDevice(dev)
	if err != nil {
		return api.GPU{}, err
	}
	mode, err := operatingMode(node.OperatingMode, dev)
	if err != nil {
		return api.GPU{}, err
	}
	if mode == api.ModeMIG {
		err = res.describeMIG(logger, dev, &cfg.Nvidia, &gpu)
	} else {
		describeHAMiCore(&cfg.Nvidia, node, &gpu, memoryMiB)
		err = res.refuseHAMiCoreInMIGMode(logger, dev, &gpu)
	}
	return gpu, err
}

// refuseHAMiCoreInMIGMode marks a hami-core GPU whose MIG mode is on unusable: CUDA cannot
// use a GPU in MIG mode whole, so a share of it would run nowhere.
func (r *Result) refuseHAMiCoreInMIGMode(logger klog.Logger, dev nvml.Device, gpu *api.GPU) error {
	current, _, err := dev.MigMode()
	switch {
	case nvml.IsCode(err, nvml.ErrorNotSupported):
		return nil
	case err != nil:
		return err
	case !current:
		return nil
	}
	gpu.Count = 0
	gpu.Unusable = fmt.Sprintf("MIG mode is on, and a GPU in MIG mode cannot serve hami-core shares: turn MIG mode off (nvidia-smi -i %d -mig 0, then reset the GPU) or make the node operatingmode mig", gpu.Index)
	r.addFinding(logger, "GPU %d (%s, %s) is on a hami-core node but unusable: %s", gpu.Index, gpu.ID, gpu.Type, gpu.Unusable)
	return nil
}

// libraryError is a failure of NVML itself rather than of one GPU.
func libraryError(err error) bool {
	return nvml.IsCode(err, nvml.ErrorUninitialized) || nvml.IsCode(err, nvml.ErrorLibraryNotFound)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// operatingMode is the node's configured mode, or where none is configured the GPU's own:
// mig when its MIG mode is on.
func operatingMode(configured string, dev nvml.Device) (string, error) {
	if configured != "" {
		return configured, nil
	}
	current, _, err := dev.MigMode()
	switch {
	case nvml.IsCode(err, nvml.ErrorNotSupported):
		return api.ModeHAMiCore, nil
	case err != nil:
		return "", err
	case current:
		return api.ModeMIG, nil
	}
	return api.ModeHAMiCore, nil
}

func (r *Result) addFinding(logger klog.Logger, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	logger.Info("Inventory finding", "finding", msg)
	r.Findings = append(r.Findings, msg)
}

// describeDevice fills what every mode publishes, and reads the card's memory.
func describeDevice(dev nvml.Device) (gpu api.GPU, memoryMiB int, err error) {
	uuid, err := dev.UUID()
	if err != nil {
		return gpu, 0, err
	}
	name, err := dev.Name()
	if err != nil {
		return gpu, 0, err
	}
	if memoryMiB, err = dev.MemoryMiB(); err != nil {
		return gpu, 0, err
	}
	numa, err := dev.NumaNode()
	if err != nil || numa < 0 {
		numa = 0
	}
	gpu = api.GPU{ID: uuid, Index: uint(dev.Index()), Type: name, Numa: numa, Health: true}
	if m, ok := config.LookupModel(name); ok {
		gpu.Model = m.Key
	}
	return gpu, memoryMiB, nil
}

// describeHAMiCore publishes the GPU as deviceSplitCount shares with scaled memory and cores,
// as HAMi's device plugin does.
func describeHAMiCore(nv *config.NvidiaConfig, node *config.NodeConfig, gpu *api.GPU, memoryMiB int) {
	split, memScale, coreScale := nv.DeviceSplitCount, nv.DeviceMemoryScaling, nv.DeviceCoreScaling
	if node.DeviceSplitCount != nil {
		split = *node.DeviceSplitCount
	}
	if node.DeviceMemoryScaling != nil {
		memScale = *node.DeviceMemoryScaling
	}
	if node.DeviceCoreScaling != nil {
		coreScale = *node.DeviceCoreScaling
	}
	gpu.Mode = api.ModeHAMiCore
	gpu.Count = split
	gpu.Devcore = int(100 * coreScale)
	gpu.Devmem = int(float64(memoryMiB) * memScale)
}

// describeMIG publishes the allowlisted profiles NVML reports, with their placements.
func (r *Result) describeMIG(logger klog.Logger, dev nvml.Device, nv *config.NvidiaConfig, gpu *api.GPU) error {
	gpu.Mode = api.ModeMIG
	current, _, err := dev.MigMode()
	if err != nil && !nvml.IsCode(err, nvml.ErrorNotSupported) {
		return err
	}
	if err != nil || !current {
		gpu.Unusable = fmt.Sprintf("MIG mode is off: turn it on (nvidia-smi -i %d -mig 1, or the device plugin's --enable-mig-mode) or make the node operatingmode hami-core", gpu.Index)
		if err != nil {
			gpu.Unusable = "the GPU does not support MIG: make the node operatingmode hami-core"
		}
		r.addFinding(logger, "GPU %d (%s, %s) is on a mig node but unusable: %s", gpu.Index, gpu.ID, gpu.Type, gpu.Unusable)
		return nil
	}
	profiles, err := dev.GpuInstanceProfiles()
	if err != nil {
		return err
	}
	full := fullGPUProfile(profiles)
	if full == nil {
		r.addFinding(logger, "GPU %d (%s, %s): NVML reports no full-GPU profile; published with no MIG profiles", gpu.Index, gpu.ID, gpu.Type)
		return nil
	}
	gpu.Devmem, gpu.Devcore = full.MemoryMiB, 100
	allowed, ok := nv.AllowedProfiles(gpu.Type)
	if !ok {
		r.addFinding(logger, "GPU %d (%s): no migProfileAllowlist entry names %q, so no MIG profile is published for it", gpu.Index, gpu.ID, gpu.Type)
		return nil
	}
	for _, name := range allowed {
		i := slices.IndexFunc(profiles, func(p nvml.GpuInstanceProfile) bool { return p.Name == name })
		if i < 0 {
			r.addFinding(logger, "GPU %d (%s): allowlisted profile %s is not reported by NVML; NVML reports %s", gpu.Index, gpu.Type, name, profileNames(profiles))
			continue
		}
		p := profiles[i]
		placements, err := dev.GpuInstancePossiblePlacements(p.ID)
		if err != nil {
			return err
		}
		gpu.MigProfiles = append(gpu.MigProfiles, api.MigProfile{
			Name:       p.Name,
			MemoryMB:   p.MemoryMiB,
			Core:       (p.SMs*100 + full.SMs - 1) / full.SMs,
			SliceCount: p.SliceCount,
			Placements: placements,
			Instances:  p.InstanceCount,
		})
		gpu.Count = max(gpu.Count, p.InstanceCount)
	}
	// HAMi's order: by memory, then slices.
	slices.SortStableFunc(gpu.MigProfiles, func(a, b api.MigProfile) int {
		return cmp.Or(cmp.Compare(a.MemoryMB, b.MemoryMB), cmp.Compare(a.SliceCount, b.SliceCount))
	})
	if m, ok := config.LookupModel(gpu.Type); ok {
		gpu.Slots = m.Slots
	} else {
		gpu.Slots = gpu.SlotCount()
	}
	return nil
}

// fullGPUProfile is the variant-free profile with the most slices (then memory): the one
// that percentages of memory and cores are taken of.
func fullGPUProfile(profiles []nvml.GpuInstanceProfile) *nvml.GpuInstanceProfile {
	var full *nvml.GpuInstanceProfile
	for i := range profiles {
		p := &profiles[i]
		name, err := api.ParseProfileName(p.Name)
		if err != nil || name.Variant != "" || p.SMs == 0 {
			continue
		}
		if full == nil || p.SliceCount > full.SliceCount || (p.SliceCount == full.SliceCount && p.MemoryMiB > full.MemoryMiB) {
			full = p
		}
	}
	return full
}

func profileNames(profiles []nvml.GpuInstanceProfile) string {
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}
