// Package instances creates, lists and destroys MIG instances (a GPU instance and its one
// compute instance) through the nvml interface, one GPU at a time, and never leaves a GPU
// instance behind without its compute instance when a create fails.
package instances

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

// Instance is a realised MIG device: where it is and what NVML calls it.
type Instance struct {
	GPUUUID   string
	Profile   string
	ProfileID int
	Placement api.Placement
	// GPUInstanceID and ComputeInstanceID are NVML's ids; MigUUID the MIG device's UUID.
	GPUInstanceID, ComputeInstanceID int
	MigUUID                          string
	// Processes are the PIDs running on it (listing only).
	Processes []int
	// Complete is false for a GPU instance without a compute instance (a crash between the
	// two creates, or someone else's half-made instance).
	Complete bool
}

// UnrealisableError is what no retry gets past: a GPU not on this node, a profile it does
// not have, a placement NVML does not list for the profile. Every other error (an NVML call
// that failed) may pass.
type UnrealisableError struct{ Err error }

func (e *UnrealisableError) Error() string { return e.Err.Error() }
func (e *UnrealisableError) Unwrap() error { return e.Err }

// IsUnrealisable says whether err is, or wraps, an UnrealisableError.
func IsUnrealisable(err error) bool {
	var u *UnrealisableError
	return errors.As(err, &u)
}

// unrealisable makes an UnrealisableError.
func unrealisable(format string, args ...any) error {
	return &UnrealisableError{Err: fmt.Errorf(format, args...)}
}

// Manager serialises mutation per physical GPU.
type Manager struct {
	lib nvml.Interface

	mu      sync.Mutex
	devices map[string]nvml.Device
	locks   map[string]*sync.Mutex
}

// New indexes the library's GPUs by UUID; lib must be initialised. A GPU NVML cannot
// identify (no handle, or no UUID) is left out, as the inventory leaves it out, so the
// node's other GPUs are still served; a library that cannot be used is an error.
func New(lib nvml.Interface) (*Manager, error) {
	m := &Manager{lib: lib, devices: map[string]nvml.Device{}, locks: map[string]*sync.Mutex{}}
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		uuid, dev, err := identify(lib, i)
		if nvml.IsCode(err, nvml.ErrorUninitialized) || nvml.IsCode(err, nvml.ErrorLibraryNotFound) {
			return nil, err
		}
		if err != nil {
			klog.Background().Error(err, "GPU cannot be identified; left out", "index", i)
			continue
		}
		m.devices[uuid] = dev
		m.locks[uuid] = &sync.Mutex{}
	}
	return m, nil
}

func identify(lib nvml.Interface, i int) (string, nvml.Device, error) {
	dev, err := lib.DeviceByIndex(i)
	if err != nil {
		return "", nil, err
	}
	uuid, err := dev.UUID()
	return uuid, dev, err
}

// Lock takes the GPU's mutation lock; callers that reclaim then create hold it across both.
func (m *Manager) Lock(gpuUUID string) (unlock func(), err error) {
	m.mu.Lock()
	l, ok := m.locks[gpuUUID]
	m.mu.Unlock()
	if !ok {
		return nil, unrealisable("GPU %s is not on this node", gpuUUID)
	}
	l.Lock()
	return l.Unlock, nil
}

func (m *Manager) device(gpuUUID string) (nvml.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dev, ok := m.devices[gpuUUID]
	if !ok {
		return nil, unrealisable("GPU %s is not on this node", gpuUUID)
	}
	return dev, nil
}

// GPUs lists the node's GPU UUIDs.
func (m *Manager) GPUs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.devices))
	for uuid := range m.devices {
		out = append(out, uuid)
	}
	slices.Sort(out)
	return out
}

// ProfileID resolves a profile name to the GPU's NVML profile id, by exact name (so
// variants such as 1g.10gb+me and the double-memory 1g.20gb are their own profiles), and
// checks that the placement is one NVML lists for it. A GPU not here, a profile it lacks or
// a placement not listed is an UnrealisableError; a failed NVML call is returned as it is.
func (m *Manager) ProfileID(gpuUUID, profile string, placement api.Placement) (int, error) {
	dev, err := m.device(gpuUUID)
	if err != nil {
		return 0, err
	}
	profiles, err := dev.GpuInstanceProfiles()
	if err != nil {
		return 0, err
	}
	i := slices.IndexFunc(profiles, func(p nvml.GpuInstanceProfile) bool { return p.Name == profile })
	if i < 0 {
		names := make([]string, len(profiles))
		for j, p := range profiles {
			names[j] = p.Name
		}
		return 0, unrealisable("GPU %s has no MIG profile %s (it has %v)", gpuUUID, profile, names)
	}
	legal, err := dev.GpuInstancePossiblePlacements(profiles[i].ID)
	if err != nil {
		return 0, err
	}
	if !slices.Contains(legal, placement) {
		return 0, unrealisable("placement %s is not legal for %s on GPU %s (legal: %v)", placement, profile, gpuUUID, legal)
	}
	return profiles[i].ID, nil
}

// Create makes the GPU instance of the profile at exactly that placement and its compute
// instance. The caller holds the GPU's lock. On any failure it destroys what it created, and
// the error says both what failed and whether the rollback did.
func (m *Manager) Create(ctx context.Context, gpuUUID, profile string, placement api.Placement) (Instance, error) {
	logger := klog.FromContext(ctx)
	dev, err := m.device(gpuUUID)
	if err != nil {
		return Instance{}, err
	}
	id, err := m.ProfileID(gpuUUID, profile, placement)
	if err != nil {
		return Instance{}, err
	}
	gi, err := dev.CreateGpuInstanceWithPlacement(id, placement)
	if err != nil {
		return Instance{}, fmt.Errorf("creating %s at %s on %s: %w", profile, placement, gpuUUID, err)
	}
	giInfo, err := gi.Info()
	if err != nil {
		return Instance{}, errors.Join(fmt.Errorf("reading the new GPU instance: %w", err), rollback(gi, nil))
	}
	ci, err := gi.CreateComputeInstance()
	if err != nil {
		return Instance{}, errors.Join(fmt.Errorf("creating the compute instance of %s at %s on %s: %w", profile, placement, gpuUUID, err), rollback(gi, nil))
	}
	ciInfo, err := ci.Info()
	if err != nil {
		return Instance{}, errors.Join(fmt.Errorf("reading the new compute instance: %w", err), rollback(gi, ci))
	}
	migUUID, err := m.migUUID(dev, giInfo.ID, ciInfo.ID)
	if err != nil {
		return Instance{}, errors.Join(err, rollback(gi, ci))
	}
	logger.V(2).Info("Created MIG instance", "gpu", gpuUUID, "profile", profile, "placement", placement.String(), "gpuInstanceID", giInfo.ID, "computeInstanceID", ciInfo.ID, "migUUID", migUUID)
	return Instance{GPUUUID: gpuUUID, Profile: profile, ProfileID: id, Placement: placement,
		GPUInstanceID: giInfo.ID, ComputeInstanceID: ciInfo.ID, MigUUID: migUUID, Complete: true}, nil
}

// LeftBehindError is a failed rollback of a failed Create: part of the instance is still
// at the placement, and whoever recorded the create must keep that record until it is gone.
type LeftBehindError struct{ Err error }

func (e *LeftBehindError) Error() string { return e.Err.Error() }
func (e *LeftBehindError) Unwrap() error { return e.Err }

// IsLeftBehind says whether err is, or wraps, a LeftBehindError.
func IsLeftBehind(err error) bool {
	var l *LeftBehindError
	return errors.As(err, &l)
}

// rollback destroys a compute instance (if any) and then its GPU instance.
func rollback(gi nvml.GpuInstance, ci nvml.ComputeInstance) error {
	if ci != nil {
		if err := ci.Destroy(); err != nil {
			return &LeftBehindError{fmt.Errorf("rollback: destroying the compute instance: %w", err)}
		}
	}
	if err := gi.Destroy(); err != nil {
		return &LeftBehindError{fmt.Errorf("rollback: destroying the GPU instance: %w", err)}
	}
	return nil
}

func (m *Manager) migUUID(dev nvml.Device, giID, ciID int) (string, error) {
	migs, err := dev.MigDevices()
	if err != nil {
		return "", err
	}
	for _, md := range migs {
		g, err1 := md.GpuInstanceID()
		c, err2 := md.ComputeInstanceID()
		if err1 == nil && err2 == nil && g == giID && c == ciID {
			return md.UUID()
		}
	}
	return "", fmt.Errorf("no MIG device for GPU instance %d, compute instance %d", giID, ciID)
}

// List reports every GPU instance on the GPU with its compute instance, MIG UUID and
// processes.
func (m *Manager) List(gpuUUID string) ([]Instance, error) {
	dev, err := m.device(gpuUUID)
	if err != nil {
		return nil, err
	}
	gis, err := dev.GpuInstances()
	if err != nil {
		if nvml.IsCode(err, nvml.ErrorNotSupported) {
			return nil, nil // MIG mode off: no instances
		}
		return nil, err
	}
	profiles, err := dev.GpuInstanceProfiles()
	if err != nil {
		return nil, err
	}
	migs, err := dev.MigDevices()
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, gi := range gis {
		info, err := gi.Info()
		if err != nil {
			return nil, err
		}
		in := Instance{GPUUUID: gpuUUID, ProfileID: info.ProfileID, Placement: info.Placement, GPUInstanceID: info.ID, ComputeInstanceID: -1}
		if i := slices.IndexFunc(profiles, func(p nvml.GpuInstanceProfile) bool { return p.ID == info.ProfileID }); i >= 0 {
			in.Profile = profiles[i].Name
		}
		cis, err := gi.ComputeInstances()
		if err != nil {
			return nil, err
		}
		if len(cis) > 0 {
			ciInfo, err := cis[0].Info()
			if err != nil {
				return nil, err
			}
			in.ComputeInstanceID = ciInfo.ID
			for _, md := range migs {
				g, _ := md.GpuInstanceID()
				c, _ := md.ComputeInstanceID()
				if g == info.ID && c == ciInfo.ID {
					if in.MigUUID, err = md.UUID(); err != nil {
						return nil, err
					}
					if in.Processes, err = md.RunningProcesses(); err != nil {
						return nil, err
					}
				}
			}
			in.Complete = in.MigUUID != ""
		}
		out = append(out, in)
	}
	return out, nil
}

// Destroy destroys the GPU instance and its compute instances; the caller holds the GPU's
// lock. A compute instance with processes makes it fail with NVML's IN_USE, and nothing of
// that instance is destroyed then.
func (m *Manager) Destroy(ctx context.Context, gpuUUID string, gpuInstanceID int) error {
	dev, err := m.device(gpuUUID)
	if err != nil {
		return err
	}
	gi, err := dev.GpuInstanceByID(gpuInstanceID)
	if err != nil {
		return fmt.Errorf("finding GPU instance %d on %s: %w", gpuInstanceID, gpuUUID, err)
	}
	cis, err := gi.ComputeInstances()
	if err != nil {
		return err
	}
	for _, ci := range cis {
		if err := ci.Destroy(); err != nil {
			return fmt.Errorf("destroying a compute instance of GPU instance %d on %s: %w", gpuInstanceID, gpuUUID, err)
		}
	}
	if err := gi.Destroy(); err != nil {
		return fmt.Errorf("destroying GPU instance %d on %s: %w", gpuInstanceID, gpuUUID, err)
	}
	klog.FromContext(ctx).V(2).Info("Destroyed MIG instance", "gpu", gpuUUID, "gpuInstanceID", gpuInstanceID)
	return nil
}
