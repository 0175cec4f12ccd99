package sim

import (
	"fmt"

	"github.com/dynamig/dynamig/nvml"
)

// gpuInstance is the handle of one GI; it outlives the GI and then answers ERROR_NOT_FOUND.
type gpuInstance struct {
	s  *Sim
	gi *giState
}

// computeInstance is the handle of one CI.
type computeInstance struct {
	s  *Sim
	ci *ciState
}

// migDevice is the MIG device of one CI.
type migDevice struct {
	s  *Sim
	ci *ciState
}

var (
	_ nvml.GpuInstance     = (*gpuInstance)(nil)
	_ nvml.ComputeInstance = (*computeInstance)(nil)
	_ nvml.MigDevice       = (*migDevice)(nil)
)

// ciProfileBySlices maps a GI's compute slices to the COMPUTE_INSTANCE_PROFILE_* index of its
// full-GI compute instance.
var ciProfileBySlices = map[int]int{1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

const (
	// giProfile1SliceRev2 is GPU_INSTANCE_PROFILE_1_SLICE_REV2, the double-memory 1g.
	giProfile1SliceRev2 = 9
	// ciProfile1SliceRev1 is COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, that 1g's default CI.
	ciProfile1SliceRev1 = 7
)

func (h *gpuInstance) op(name string) string {
	return fmt.Sprintf("%s(%s, GI %d)", name, h.gi.gpu.uuid, h.gi.id)
}

// begin checks Init and that the GI still exists; callers hold s.mu.
func (h *gpuInstance) begin(op string) error {
	if err := h.s.checkInit(op); err != nil {
		return err
	}
	if h.gi.gpu.lost {
		return nvml.Errorf(nvml.ErrorGPUIsLost, op, "the GPU has fallen off the bus")
	}
	if h.gi.destroyed {
		return nvml.Errorf(nvml.ErrorNotFound, op, "the GPU instance no longer exists")
	}
	return nil
}

func (h *gpuInstance) Info() (nvml.GpuInstanceInfo, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if err := h.begin(h.op("GpuInstance.Info")); err != nil {
		return nvml.GpuInstanceInfo{}, err
	}
	return nvml.GpuInstanceInfo{ID: h.gi.id, ProfileID: h.gi.profile.ID, Placement: h.gi.placement}, nil
}

// CreateComputeInstance creates the GI's one full-GI compute instance and its MIG device.
func (h *gpuInstance) CreateComputeInstance() (_ nvml.ComputeInstance, err error) {
	h.s.waitHold(h.gi.gpu, OpCreateComputeInstance)
	defer func() { h.s.runAfter(h.gi.gpu, OpCreateComputeInstance, err) }()
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	op := h.op("CreateComputeInstance")
	if err := h.begin(op); err != nil {
		return nil, err
	}
	if err := h.gi.gpu.takeFault(OpCreateComputeInstance, op); err != nil {
		return nil, err
	}
	if len(h.gi.cis) > 0 {
		return nil, nvml.Errorf(nvml.ErrorInsufficientRes, op, "the GPU instance's compute slices are taken by its compute instance")
	}
	ciProfile, ok := h.gi.ciProfile()
	if !ok {
		return nil, nvml.Errorf(nvml.ErrorNotSupported, op, "no compute-instance profile spans %d slices", h.gi.name.Slices)
	}
	// A fresh MIG UUID: past any a restored state file holds.
	var migUUID string
	for {
		h.s.migCounter++
		migUUID = "MIG-" + hashUUID("mig", h.s.opts.Seed, fmt.Sprint(h.s.migCounter))
		if _, err := h.s.findCI(migUUID); err != nil {
			break
		}
	}
	ci := &ciState{
		gi:        h.gi,
		id:        0, // the full-GI CI starts at the GI's first compute slice
		profileID: ciProfile,
		migUUID:   migUUID,
		procs:     map[int]bool{},
	}
	h.gi.cis[ci.id] = ci
	if err := h.s.persisted(op); err != nil {
		return nil, err
	}
	return &computeInstance{s: h.s, ci: ci}, nil
}

func (h *gpuInstance) ComputeInstances() ([]nvml.ComputeInstance, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if err := h.begin(h.op("ComputeInstances")); err != nil {
		return nil, err
	}
	var out []nvml.ComputeInstance
	for _, ci := range h.gi.sortedCIs() {
		out = append(out, &computeInstance{s: h.s, ci: ci})
	}
	return out, nil
}

// Destroy destroys the GI; ERROR_IN_USE while it has compute instances.
func (h *gpuInstance) Destroy() (err error) {
	h.s.waitHold(h.gi.gpu, OpDestroyGpuInstance)
	defer func() { h.s.runAfter(h.gi.gpu, OpDestroyGpuInstance, err) }()
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	op := h.op("GpuInstance.Destroy")
	if err := h.begin(op); err != nil {
		return err
	}
	if err := h.gi.gpu.takeFault(OpDestroyGpuInstance, op); err != nil {
		return err
	}
	if n := len(h.gi.cis); n > 0 {
		return nvml.Errorf(nvml.ErrorInUse, op, "%d compute instances exist; destroy them first", n)
	}
	h.gi.remove()
	return h.s.persisted(op)
}

func (h *computeInstance) op(name string) string {
	return fmt.Sprintf("%s(%s, GI %d, CI %d)", name, h.ci.gi.gpu.uuid, h.ci.gi.id, h.ci.id)
}

// liveCI checks Init and that the CI still exists; callers hold s.mu.
func liveCI(s *Sim, ci *ciState, op string) error {
	if err := s.checkInit(op); err != nil {
		return err
	}
	if ci.gi.gpu.lost {
		return nvml.Errorf(nvml.ErrorGPUIsLost, op, "the GPU has fallen off the bus")
	}
	if ci.destroyed {
		return nvml.Errorf(nvml.ErrorNotFound, op, "the compute instance no longer exists")
	}
	return nil
}

func (h *computeInstance) Info() (nvml.ComputeInstanceInfo, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if err := liveCI(h.s, h.ci, h.op("ComputeInstance.Info")); err != nil {
		return nvml.ComputeInstanceInfo{}, err
	}
	return nvml.ComputeInstanceInfo{ID: h.ci.id, ProfileID: h.ci.profileID, GpuInstanceID: h.ci.gi.id}, nil
}

// Destroy destroys the CI and its MIG device; ERROR_IN_USE while processes run on it.
func (h *computeInstance) Destroy() (err error) {
	h.s.waitHold(h.ci.gi.gpu, OpDestroyComputeInstance)
	defer func() { h.s.runAfter(h.ci.gi.gpu, OpDestroyComputeInstance, err) }()
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	op := h.op("ComputeInstance.Destroy")
	if err := liveCI(h.s, h.ci, op); err != nil {
		return err
	}
	if err := h.ci.gi.gpu.takeFault(OpDestroyComputeInstance, op); err != nil {
		return err
	}
	if n := len(h.ci.procs); n > 0 {
		return nvml.Errorf(nvml.ErrorInUse, op, "%d processes run on %s", n, h.ci.migUUID)
	}
	h.ci.destroyed = true
	delete(h.ci.gi.cis, h.ci.id)
	return h.s.persisted(op)
}

func (m *migDevice) op(name string) string {
	return fmt.Sprintf("MigDevice.%s(%s)", name, m.ci.migUUID)
}

func (m *migDevice) UUID() (string, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if err := liveCI(m.s, m.ci, m.op("UUID")); err != nil {
		return "", err
	}
	return m.ci.migUUID, nil
}

func (m *migDevice) GpuInstanceID() (int, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if err := liveCI(m.s, m.ci, m.op("GpuInstanceID")); err != nil {
		return 0, err
	}
	return m.ci.gi.id, nil
}

func (m *migDevice) ComputeInstanceID() (int, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if err := liveCI(m.s, m.ci, m.op("ComputeInstanceID")); err != nil {
		return 0, err
	}
	return m.ci.id, nil
}

// MemoryMiB is the GI profile's memory.
func (m *migDevice) MemoryMiB() (int, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if err := liveCI(m.s, m.ci, m.op("MemoryMiB")); err != nil {
		return 0, err
	}
	return m.ci.gi.profile.MemoryMiB, nil
}

// RunningProcesses lists the PIDs on the device in ascending order.
func (m *migDevice) RunningProcesses() ([]int, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if err := liveCI(m.s, m.ci, m.op("RunningProcesses")); err != nil {
		return nil, err
	}
	return m.ci.pids(), nil
}

// ciProfile is the COMPUTE_INSTANCE_PROFILE index of the GI's one compute instance, the
// full-GI one; false when none spans its slices.
func (gi *giState) ciProfile() (int, bool) {
	if gi.profile.NVMLIndex == giProfile1SliceRev2 {
		return ciProfile1SliceRev1, true
	}
	p, ok := ciProfileBySlices[gi.name.Slices]
	return p, ok
}
