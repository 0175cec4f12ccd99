package sim

import (
	"fmt"
	"time"

	"github.com/dynamig/dynamig/nvml"
)

// eventSet is a simulated nvmlEventSet: the events of the GPUs registered with it, queued
// until Wait takes them.
type eventSet struct {
	s *Sim
	// types are the registered event types per GPU; guarded by s.mu.
	types  map[*gpuState]nvml.EventType
	events chan nvml.Event
	freed  bool
}

// eventQueue bounds the events a set holds; an injection beyond it blocks, as a test that
// never waits is a bug.
const eventQueue = 64

func (s *Sim) NewEventSet() (nvml.EventSet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkInit("EventSetCreate"); err != nil {
		return nil, err
	}
	set := &eventSet{s: s, types: map[*gpuState]nvml.EventType{}, events: make(chan nvml.Event, eventQueue)}
	s.eventSets = append(s.eventSets, set)
	return set, nil
}

func (e *eventSet) Register(d nvml.Device, types nvml.EventType) error {
	dev, ok := d.(*device)
	if !ok || dev.s != e.s {
		return fmt.Errorf("RegisterEvents: %T is not a device of this simulator", d)
	}
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	if err := dev.check(dev.op("RegisterEvents")); err != nil {
		return err
	}
	if e.freed {
		return nvml.Errorf(nvml.ErrorInvalidArgument, dev.op("RegisterEvents"), "the event set was freed")
	}
	e.types[dev.g] |= types
	return nil
}

func (e *eventSet) Wait(timeout time.Duration) (nvml.Event, error) {
	select {
	case ev := <-e.events:
		return ev, nil
	case <-time.After(timeout):
		return nvml.Event{}, nvml.Errorf(nvml.ErrorTimeout, "EventSetWait", "no event within %s", timeout)
	}
}

func (e *eventSet) Free() error {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	e.freed = true
	e.types = map[*gpuState]nvml.EventType{}
	return nil
}

// InjectXID reports XID xid on the GPU (a critical-error event) to every event set that
// registered the GPU for EventXidCriticalError; giID and ciID place it on a MIG device, -1
// when it is the whole GPU's. It changes nothing else: SetResetPending says whether the
// error left the GPU needing a reset.
func (s *Sim) InjectXID(gpuIndex int, xid uint64, giID, ciID int) {
	s.inject(gpuIndex, nvml.Event{Type: nvml.EventXidCriticalError, Data: xid, GPUInstanceID: giID, ComputeInstanceID: ciID})
}

// InjectDoubleBitECC reports an uncorrectable (double-bit) ECC error on the GPU.
func (s *Sim) InjectDoubleBitECC(gpuIndex int) {
	s.inject(gpuIndex, nvml.Event{Type: nvml.EventDoubleBitECCError, GPUInstanceID: -1, ComputeInstanceID: -1})
}

func (s *Sim) inject(gpuIndex int, ev nvml.Event) {
	s.mu.Lock()
	g := s.mustGPU(gpuIndex)
	ev.GPUUUID = g.uuid
	var to []*eventSet
	for _, set := range s.eventSets {
		if set.types[g]&ev.Type != 0 {
			to = append(to, set)
		}
	}
	s.mu.Unlock()
	for _, set := range to {
		set.events <- ev
	}
}

// SetResetPending makes ResetPending of the GPU answer pending (as NVML does while rows wait
// to be remapped or pages to be retired) until it is set false again, as a GPU reset does.
func (s *Sim) SetResetPending(gpuIndex int, pending bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mustGPU(gpuIndex).resetPending = pending
}

func (d *device) ResetPending() (bool, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("ResetPending")); err != nil {
		return false, err
	}
	return d.g.resetPending, nil
}
