package cdi

import (
	"fmt"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// VisibleDevicesEnv names the devices a container gets, by UUID. With EnvOnly it is all the
// container gets (the NVIDIA container runtime's hook injects them); with NVCDI it is
// informational, the spec carrying the devices themselves.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// NoDevices is VisibleDevicesEnv's value for no GPU at all.
const NoDevices = "void"

// DeviceEdits says what a container gets for its devices, by UUID (MIG or GPU).
type DeviceEdits interface {
	Edits(uuids []string) (specs.ContainerEdits, error)
}

// EnvOnly gives a container only NVIDIA_VISIBLE_DEVICES=<uuids>: right for simulated GPUs
// and for nodes whose runtime is the NVIDIA container runtime, whose hook injects the
// devices the variable names.
type EnvOnly struct{}

// Edits is NVIDIA_VISIBLE_DEVICES with the UUIDs joined by ','.
func (EnvOnly) Edits(uuids []string) (specs.ContainerEdits, error) {
	return specs.ContainerEdits{Env: []string{visibleDevices(uuids)}}, nil
}

func visibleDevices(uuids []string) string {
	return VisibleDevicesEnv + "=" + strings.Join(uuids, ",")
}

// MergeDeviceSpecs is what a container gets for the devices uuids from NVIDIA's CDI
// generation: the edits common to every device (the driver's libraries, hooks and control
// nodes), then each device's own, and NVIDIA_VISIBLE_DEVICES=<uuids> in place of the
// common edits' NVIDIA_VISIBLE_DEVICES=void.
func MergeDeviceSpecs(uuids []string, common specs.ContainerEdits, devices []specs.Device) (specs.ContainerEdits, error) {
	if len(uuids) > 0 && len(devices) == 0 {
		return specs.ContainerEdits{}, fmt.Errorf("no CDI device spec for %s", strings.Join(uuids, ","))
	}
	parts := make([]specs.ContainerEdits, 0, len(devices)+2)
	parts = append(parts, common)
	for _, d := range devices {
		parts = append(parts, d.ContainerEdits)
	}
	parts = append(parts, specs.ContainerEdits{Env: []string{visibleDevices(uuids)}})
	return Merge(parts...), nil
}

// Merge joins edits in order, each thing once: a variable set twice keeps its first place
// and its last value, a device node or mount at a path already taken replaces the earlier
// one, and a hook or group given twice is kept once. Merging what the device gets with what
// HAMi-core adds (in that order) lets HAMi-core's variables win.
func Merge(parts ...specs.ContainerEdits) specs.ContainerEdits {
	all := &cdi.ContainerEdits{ContainerEdits: &specs.ContainerEdits{}}
	for i := range parts {
		all = all.Append(&cdi.ContainerEdits{ContainerEdits: &parts[i]})
	}
	in := all.ContainerEdits
	var out specs.ContainerEdits
	out.Env = lastWins(in.Env, func(kv string) string { k, _, _ := strings.Cut(kv, "="); return k })
	out.DeviceNodes = lastWins(in.DeviceNodes, func(d *specs.DeviceNode) string { return d.Path })
	out.Mounts = lastWins(in.Mounts, func(m *specs.Mount) string { return m.ContainerPath })
	out.Hooks = lastWins(in.Hooks, func(h *specs.Hook) string {
		timeout := ""
		if h.Timeout != nil {
			timeout = fmt.Sprint(*h.Timeout)
		}
		return fmt.Sprintf("%s\x00%s\x00%q\x00%q\x00%s", h.HookName, h.Path, h.Args, h.Env, timeout)
	})
	out.AdditionalGIDs = lastWins(in.AdditionalGIDs, func(g uint32) uint32 { return g })
	out.IntelRdt = in.IntelRdt
	return out
}

// lastWins keeps one element per key, at the key's first position, with its last value.
func lastWins[T any, K comparable](in []T, key func(T) K) []T {
	if len(in) == 0 {
		return nil
	}
	at := make(map[K]int, len(in))
	out := make([]T, 0, len(in))
	for _, v := range in {
		k := key(v)
		if i, ok := at[k]; ok {
			out[i] = v
			continue
		}
		at[k] = len(out)
		out = append(out, v)
	}
	return out
}
