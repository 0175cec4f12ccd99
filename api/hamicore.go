package api

import (
	"fmt"
	"strconv"
	"strings"
)

// HAMiCoreDevice is one hami-core share of a container, in HAMi's annotation format
// "UUID,Type,memoryMiB,cores:" per device and ";" per container (hami.io/vgpu-devices-allocated
// and hami.io/vgpu-devices-to-allocate).
type HAMiCoreDevice struct {
	UUID      string
	Type      string
	MemoryMiB int
	Cores     int
}

// EncodeHAMiCoreDevices writes the devices of every container, in containerIndex order
// (every container has a segment, empty for those without devices).
func EncodeHAMiCoreDevices(containers [][]HAMiCoreDevice) string {
	var b strings.Builder
	for _, devs := range containers {
		for _, d := range devs {
			fmt.Fprintf(&b, "%s,%s,%d,%d:", d.UUID, d.Type, d.MemoryMiB, d.Cores)
		}
		b.WriteString(";")
	}
	return b.String()
}

// DecodeHAMiCoreDevices reads HAMi's format; errors name the container, the device and the
// field.
func DecodeHAMiCoreDevices(key, raw string) ([][]HAMiCoreDevice, error) {
	var out [][]HAMiCoreDevice
	segments := strings.Split(raw, ";")
	if len(segments) > 0 && segments[len(segments)-1] == "" {
		segments = segments[:len(segments)-1]
	}
	for ci, seg := range segments {
		var devs []HAMiCoreDevice
		for di, item := range strings.Split(seg, ":") {
			if item == "" {
				continue
			}
			f := strings.Split(item, ",")
			if len(f) != 4 {
				return nil, fmt.Errorf("%s: container %d device %d: %q: want UUID,Type,memory,cores", key, ci, di, item)
			}
			mem, err1 := strconv.Atoi(f[2])
			cores, err2 := strconv.Atoi(f[3])
			if err1 != nil || mem < 0 {
				return nil, fmt.Errorf("%s: container %d device %d: memory %q is not a non-negative whole number", key, ci, di, f[2])
			}
			if err2 != nil || cores < 0 {
				return nil, fmt.Errorf("%s: container %d device %d: cores %q is not a non-negative whole number", key, ci, di, f[3])
			}
			if f[0] == "" {
				return nil, fmt.Errorf("%s: container %d device %d: empty GPU UUID", key, ci, di)
			}
			devs = append(devs, HAMiCoreDevice{UUID: f[0], Type: f[1], MemoryMiB: mem, Cores: cores})
		}
		out = append(out, devs)
	}
	return out, nil
}
