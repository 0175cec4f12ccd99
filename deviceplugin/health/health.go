// Package health judges GPU health from NVML's events, as NVIDIA's device plugin and HAMi
// do: a critical XID (fallen off the bus, uncontained or double-bit ECC errors, row-remap
// failures, …) or a double-bit ECC error makes the GPU unhealthy, so the kubelet and the
// scheduler stop placing pods on it, while the XIDs an application causes by itself are
// ignored. A GPU is healthy again only when NVML says so: it answers again and no longer
// needs a reset (no rows or pages waiting for one).
package health

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/nvml"
)

// DefaultIgnoredXIDs are the XIDs NVIDIA's device plugin ignores by default: an application
// causes them (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
// timeout), and the GPU stays usable for other pods.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Watched are the event types that make a GPU unhealthy.
const Watched = nvml.EventXidCriticalError | nvml.EventDoubleBitECCError

// Change is a GPU turning unhealthy (Reason set) or healthy again.
type Change struct {
	GPUUUID string
	Healthy bool
	// Reason says what NVML reported, e.g. "XID 79".
	Reason string
	// GPUInstanceID is the MIG GPU instance the event named, -1 for the whole GPU.
	GPUInstanceID int
}

// Monitor watches every GPU of the library.
type Monitor struct {
	lib     nvml.Interface
	ignored map[uint64]bool
	// Recheck is how often an unhealthy GPU is asked whether it is healthy again.
	Recheck time.Duration
	// OnChange, if set, is called (on the monitor's goroutine) for every change.
	OnChange func(Change)

	mu        sync.Mutex
	unhealthy map[string]string // GPU UUID → reason
}

// New watches lib's GPUs; ignored are the XIDs that leave a GPU healthy.
func New(lib nvml.Interface, ignored []uint64) *Monitor {
	m := &Monitor{lib: lib, ignored: map[uint64]bool{}, Recheck: 30 * time.Second, unhealthy: map[string]string{}}
	for _, x := range ignored {
		m.ignored[x] = true
	}
	return m
}

// Unhealthy returns the unhealthy GPUs with the reason of each.
func (m *Monitor) Unhealthy() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.unhealthy)
}

// Run registers every GPU for the watched events and handles them until ctx ends. A GPU
// that cannot be registered (NVML cannot watch it, or it is already lost) is logged and
// judged by its failing calls only.
func (m *Monitor) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	set, err := m.lib.NewEventSet()
	if err != nil {
		return fmt.Errorf("GPU health events: %w", err)
	}
	defer func() { _ = set.Free() }()
	n, err := m.lib.DeviceCount()
	if err != nil {
		return fmt.Errorf("GPU health events: %w", err)
	}
	devices := map[string]nvml.Device{}
	for i := 0; i < n; i++ {
		dev, err := m.lib.DeviceByIndex(i)
		if err != nil {
			logger.Error(err, "GPU health events: GPU not watched", "index", i)
			continue
		}
		uuid, err := dev.UUID()
		if err == nil {
			err = set.Register(dev, Watched)
		}
		if err != nil {
			logger.Error(err, "GPU health events: GPU not watched", "index", i)
			continue
		}
		devices[uuid] = dev
	}
	lastCheck := time.Now()
	for ctx.Err() == nil {
		ev, err := set.Wait(time.Second)
		switch {
		case nvml.IsCode(err, nvml.ErrorTimeout):
		case err != nil:
			logger.Error(err, "Waiting for GPU health events")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		default:
			m.handle(ctx, ev)
		}
		if time.Since(lastCheck) >= m.Recheck {
			lastCheck = time.Now()
			m.recheck(ctx, devices)
		}
	}
	return nil
}

// handle judges one event.
func (m *Monitor) handle(ctx context.Context, ev nvml.Event) {
	logger := klog.FromContext(ctx).WithValues("gpu", ev.GPUUUID, "gpuInstanceID", ev.GPUInstanceID)
	var reason string
	switch {
	case ev.Type&nvml.EventXidCriticalError != 0 && m.ignored[ev.Data]:
		logger.V(2).Info("Application XID: the GPU stays healthy", "xid", ev.Data)
		return
	case ev.Type&nvml.EventXidCriticalError != 0:
		reason = fmt.Sprintf("XID %d", ev.Data)
	case ev.Type&nvml.EventDoubleBitECCError != 0:
		reason = "double-bit ECC error"
	default:
		return
	}
	m.mu.Lock()
	_, already := m.unhealthy[ev.GPUUUID]
	m.unhealthy[ev.GPUUUID] = reason
	m.mu.Unlock()
	logger.Info("GPU unhealthy: no new pods are placed on it", "reason", reason, "already", already)
	if m.OnChange != nil {
		m.OnChange(Change{GPUUUID: ev.GPUUUID, Reason: reason, GPUInstanceID: ev.GPUInstanceID})
	}
}

// recheck makes healthy again the GPUs that answer and need no reset.
func (m *Monitor) recheck(ctx context.Context, devices map[string]nvml.Device) {
	for uuid, reason := range m.Unhealthy() {
		dev, ok := devices[uuid]
		if !ok {
			continue
		}
		pending, err := dev.ResetPending()
		if err != nil || pending {
			klog.FromContext(ctx).V(2).Info("GPU still unhealthy", "gpu", uuid, "reason", reason, "resetPending", pending, "err", err)
			continue
		}
		m.mu.Lock()
		delete(m.unhealthy, uuid)
		m.mu.Unlock()
		klog.FromContext(ctx).Info("GPU healthy again: NVML answers and no reset is pending", "gpu", uuid, "was", reason)
		if m.OnChange != nil {
			m.OnChange(Change{GPUUUID: uuid, Healthy: true, Reason: reason, GPUInstanceID: -1})
		}
	}
}
