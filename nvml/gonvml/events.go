package gonvml

import (
	"fmt"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/dynamig/dynamig/nvml"
)

var _ nvml.EventSet = (*eventSet)(nil)

type eventSet struct {
	set gonvml.EventSet
}

func (b *backend) NewEventSet() (nvml.EventSet, error) {
	set, ret := b.lib.EventSetCreate()
	if err := toError(ret, "EventSetCreate"); err != nil {
		return nil, err
	}
	return &eventSet{set: set}, nil
}

func (s *eventSet) Register(d nvml.Device, types nvml.EventType) error {
	dev, ok := d.(*device)
	if !ok {
		return fmt.Errorf("RegisterEvents: %T is not a device of this library", d)
	}
	return toError(dev.dev.RegisterEvents(uint64(types), s.set), dev.op("RegisterEvents", fmt.Sprintf("%#x", uint64(types))))
}

// noInstance is NVML's GPU and compute instance id of an event not on a MIG device.
const noInstance = 0xFFFFFFFF

func (s *eventSet) Wait(timeout time.Duration) (nvml.Event, error) {
	data, ret := s.set.Wait(uint32(timeout.Milliseconds()))
	if err := toError(ret, "EventSetWait"); err != nil {
		return nvml.Event{}, err
	}
	ev := nvml.Event{Type: nvml.EventType(data.EventType), Data: data.EventData, GPUInstanceID: -1, ComputeInstanceID: -1}
	if data.GpuInstanceId != noInstance {
		ev.GPUInstanceID = int(data.GpuInstanceId)
	}
	if data.ComputeInstanceId != noInstance {
		ev.ComputeInstanceID = int(data.ComputeInstanceId)
	}
	if data.Device != nil {
		uuid, ret := data.Device.GetUUID()
		if err := toError(ret, "GetUUID(the event's device)"); err != nil {
			return ev, err
		}
		ev.GPUUUID = uuid
	}
	return ev, nil
}

func (s *eventSet) Free() error {
	return toError(s.set.Free(), "EventSetFree")
}

// ResetPending reads the row-remapping state, and where the GPU has none the page
// retirement state.
func (d *device) ResetPending() (bool, error) {
	_, _, pending, failed, ret := d.dev.GetRemappedRows()
	if ret == gonvml.SUCCESS {
		return pending || failed, nil
	}
	if ret != gonvml.ERROR_NOT_SUPPORTED {
		return false, toError(ret, d.op("GetRemappedRows"))
	}
	state, ret := d.dev.GetRetiredPagesPendingStatus()
	if err := toError(ret, d.op("GetRetiredPagesPendingStatus")); err != nil {
		return false, err
	}
	return state == gonvml.FEATURE_ENABLED, nil
}
