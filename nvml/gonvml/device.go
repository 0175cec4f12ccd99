package gonvml

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

// device is one physical GPU.
type device struct {
	b     *backend
	dev   gonvml.Device
	index int

	refOnce sync.Once
	ref     string // UUID, or "GPU <index>" when NVML cannot tell; names the GPU in errors

	mu       sync.Mutex
	profiles []profile // cached once non-empty: a GPU's profiles do not change under a loaded driver
}

func (d *device) Index() int { return d.index }

// name returns the GPU's UUID for error messages, fetched once.
func (d *device) name() string {
	d.refOnce.Do(func() {
		d.ref = fmt.Sprintf("GPU %d", d.index)
		if uuid, ret := d.dev.GetUUID(); ret == gonvml.SUCCESS && uuid != "" {
			d.ref = uuid
		}
	})
	return d.ref
}

func (d *device) op(call string, args ...any) string {
	parts := []string{d.name()}
	for _, a := range args {
		parts = append(parts, fmt.Sprint(a))
	}
	return call + "(" + strings.Join(parts, ", ") + ")"
}

func (d *device) UUID() (string, error) {
	uuid, ret := d.dev.GetUUID()
	return uuid, toError(ret, fmt.Sprintf("GetUUID(GPU %d)", d.index))
}

func (d *device) Name() (string, error) {
	name, ret := d.dev.GetName()
	return name, toError(ret, d.op("GetName"))
}

func (d *device) MemoryMiB() (int, error) {
	mem, ret := d.dev.GetMemoryInfo()
	if err := toError(ret, d.op("GetMemoryInfo")); err != nil {
		return 0, err
	}
	return int(mem.Total >> 20), nil
}

// NumaNode asks NVML (nvmlDeviceGetNumaNodeId, R550 and newer) and otherwise reads the PCI
// device's numa_node in sysfs, which every driver has; -1 when neither knows.
func (d *device) NumaNode() (int, error) {
	if d.b.hasSymbol("nvmlDeviceGetNumaNodeId") {
		node, ret := d.dev.GetNumaNodeId()
		if ret == gonvml.SUCCESS {
			return node, nil
		}
		if ret != gonvml.ERROR_NOT_SUPPORTED && ret != gonvml.ERROR_FUNCTION_NOT_FOUND {
			return -1, toError(ret, d.op("GetNumaNodeId"))
		}
	}
	pci, ret := d.dev.GetPciInfo()
	if ret != gonvml.SUCCESS {
		if ret == gonvml.ERROR_NOT_SUPPORTED {
			return -1, nil
		}
		return -1, toError(ret, d.op("GetPciInfo"))
	}
	return sysfsNumaNode(d.b.sysfsRoot, cString(pci.BusId[:])), nil
}

// sysfsNumaNode reads <root>/bus/pci/devices/<addr>/numa_node for an NVML bus id
// ("00000000:3B:00.0", an 8-digit domain where sysfs uses 4); -1 when unknown.
func sysfsNumaNode(root, busID string) int {
	var domain, bus, dev, fn uint64
	if _, err := fmt.Sscanf(busID, "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err != nil {
		return -1
	}
	addr := fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn)
	data, err := os.ReadFile(filepath.Join(root, "bus", "pci", "devices", addr, "numa_node"))
	if err != nil {
		return -1
	}
	node, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || node < 0 {
		return -1
	}
	return node
}

func (d *device) MigMode() (current, pending bool, err error) {
	cur, pend, ret := d.dev.GetMigMode()
	if err := toError(ret, d.op("GetMigMode")); err != nil {
		return false, false, err
	}
	return cur == gonvml.DEVICE_MIG_ENABLE, pend == gonvml.DEVICE_MIG_ENABLE, nil
}

// SetMigMode fails with the call's code, or, when the call succeeded but the change could
// not take effect (GPU in use, reset needed), with the activation status's code: the mode is
// then pending, which MigMode shows.
func (d *device) SetMigMode(enabled bool) error {
	mode := gonvml.DEVICE_MIG_DISABLE
	if enabled {
		mode = gonvml.DEVICE_MIG_ENABLE
	}
	op := d.op("SetMigMode", fmt.Sprintf("enabled=%t", enabled))
	activation, ret := d.dev.SetMigMode(mode)
	if ret != gonvml.SUCCESS {
		err := toError(ret, op)
		if activation != gonvml.SUCCESS {
			err = withDetail(err, "activation status "+nvml.Return(activation).String())
		}
		return err
	}
	if activation != gonvml.SUCCESS {
		return withDetail(toError(activation, op), "activation status: the MIG mode change is pending until the GPU is reset or idle")
	}
	return nil
}

func (d *device) GpuInstancePossiblePlacements(profileID int) ([]api.Placement, error) {
	op := d.op("GetGpuInstancePossiblePlacements", fmt.Sprintf("profile %d", profileID))
	p, err := d.profileByID(profileID, op)
	if err != nil {
		return nil, err
	}
	info := p.info
	placements, ret := d.dev.GetGpuInstancePossiblePlacements(&info)
	if err := toError(ret, op); err != nil {
		return nil, err
	}
	out := make([]api.Placement, len(placements))
	for i, pl := range placements {
		out[i] = api.Placement{Start: int(pl.Start), Size: int(pl.Size)}
	}
	return out, nil
}

func (d *device) CreateGpuInstanceWithPlacement(profileID int, placement api.Placement) (nvml.GpuInstance, error) {
	op := d.op("CreateGpuInstanceWithPlacement", fmt.Sprintf("profile %d", profileID), placement)
	if placement.Start < 0 || placement.Size <= 0 {
		return nil, nvml.Errorf(nvml.ErrorInvalidArgument, op, "placement start must be >= 0 and size > 0")
	}
	p, err := d.profileByID(profileID, op)
	if err != nil {
		return nil, err
	}
	// The info NVML returned for this profile id, never one looked up by slice count.
	info := p.info
	gi, ret := d.dev.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{
		Start: uint32(placement.Start), Size: uint32(placement.Size),
	})
	if err := toError(ret, op); err != nil {
		return nil, err
	}
	return &gpuInstance{d: d, gi: gi}, nil
}

// GpuInstances lists the GIs of every supported profile, sorted by GI id.
func (d *device) GpuInstances() ([]nvml.GpuInstance, error) {
	profiles, err := d.gpuInstanceProfiles()
	if err != nil {
		return nil, err
	}
	type listed struct {
		id int
		gi *gpuInstance
	}
	var all []listed
	seen := map[uint32]bool{}
	for _, p := range profiles {
		if p.info.InstanceCount == 0 {
			continue // go-nvml sizes its buffer by InstanceCount and rejects 0
		}
		info := p.info
		gis, ret := d.dev.GetGpuInstances(&info)
		if absent(ret) {
			continue
		}
		if err := toError(ret, d.op("GetGpuInstances", fmt.Sprintf("profile %d", p.info.Id))); err != nil {
			return nil, err
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if err := toError(ret, d.op("GpuInstanceGetInfo", fmt.Sprintf("profile %d", p.info.Id))); err != nil {
				return nil, err
			}
			if seen[gii.Id] {
				continue
			}
			seen[gii.Id] = true
			all = append(all, listed{int(gii.Id), &gpuInstance{d: d, gi: gi}})
		}
	}
	sortBy(all, func(l listed) int { return l.id })
	out := make([]nvml.GpuInstance, len(all))
	for i, l := range all {
		out[i] = l.gi
	}
	return out, nil
}

func (d *device) GpuInstanceByID(id int) (nvml.GpuInstance, error) {
	gi, ret := d.dev.GetGpuInstanceById(id)
	if err := toError(ret, d.op("GetGpuInstanceById", fmt.Sprintf("GI %d", id))); err != nil {
		return nil, err
	}
	return &gpuInstance{d: d, gi: gi}, nil
}

// MigDevices lists the MIG devices in NVML's index order, skipping the holes that
// GetMigDeviceHandleByIndex reports for indexes without a device.
func (d *device) MigDevices() ([]nvml.MigDevice, error) {
	n, ret := d.dev.GetMaxMigDeviceCount()
	if err := toError(ret, d.op("GetMaxMigDeviceCount")); err != nil {
		return nil, err
	}
	var out []nvml.MigDevice
	for i := 0; i < n; i++ {
		mig, ret := d.dev.GetMigDeviceHandleByIndex(i)
		if ret == gonvml.ERROR_NOT_FOUND || ret == gonvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := toError(ret, d.op("GetMigDeviceHandleByIndex", i)); err != nil {
			return nil, err
		}
		out = append(out, &migDevice{d: d, dev: mig, index: i})
	}
	return out, nil
}

// migDevice is the handle of one MIG device (one CI).
type migDevice struct {
	d     *device
	dev   gonvml.Device
	index int
}

func (m *migDevice) op(call string) string {
	return fmt.Sprintf("%s(%s MIG device %d)", call, m.d.name(), m.index)
}

func (m *migDevice) UUID() (string, error) {
	uuid, ret := m.dev.GetUUID()
	return uuid, toError(ret, m.op("GetUUID"))
}

func (m *migDevice) GpuInstanceID() (int, error) {
	id, ret := m.dev.GetGpuInstanceId()
	return id, toError(ret, m.op("GetGpuInstanceId"))
}

func (m *migDevice) ComputeInstanceID() (int, error) {
	id, ret := m.dev.GetComputeInstanceId()
	return id, toError(ret, m.op("GetComputeInstanceId"))
}

func (m *migDevice) MemoryMiB() (int, error) {
	mem, ret := m.dev.GetMemoryInfo()
	if err := toError(ret, m.op("GetMemoryInfo")); err != nil {
		return 0, err
	}
	return int(mem.Total >> 20), nil
}

func (m *migDevice) RunningProcesses() ([]int, error) {
	procs, ret := m.dev.GetComputeRunningProcesses()
	if err := toError(ret, m.op("GetComputeRunningProcesses")); err != nil {
		return nil, err
	}
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = int(p.Pid)
	}
	return pids, nil
}
