package sim

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
)

// device is the handle of one simulated GPU.
type device struct {
	s *Sim
	g *gpuState
}

var _ nvml.Device = (*device)(nil)

// op names a call on this GPU for errors: "Name(GPU-…)" or "Name(GPU-…, args)".
func (d *device) op(name string, args ...any) string {
	if len(args) == 0 {
		return fmt.Sprintf("%s(%s)", name, d.g.uuid)
	}
	return fmt.Sprintf("%s(%s, %s)", name, d.g.uuid, fmt.Sprint(args...))
}

// checkMig fails as NVML does when MIG mode is off; callers hold s.mu.
func (g *gpuState) checkMig(op string) error {
	if !g.migCurrent {
		return nvml.Errorf(nvml.ErrorNotSupported, op, "MIG mode is disabled on %s", g.uuid)
	}
	return nil
}

func (d *device) Index() int { return d.g.index }

// check is checkInit plus a lost GPU; callers hold s.mu.
func (d *device) check(op string) error {
	if err := d.s.checkInit(op); err != nil {
		return err
	}
	if d.g.lost {
		return nvml.Errorf(nvml.ErrorGPUIsLost, op, "the GPU has fallen off the bus")
	}
	return nil
}

func (d *device) UUID() (string, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.s.checkInit(d.op("UUID")); err != nil {
		return "", err
	}
	return d.g.uuid, nil
}

func (d *device) Name() (string, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("Name")); err != nil {
		return "", err
	}
	return d.g.name, nil
}

func (d *device) MemoryMiB() (int, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("MemoryMiB")); err != nil {
		return 0, err
	}
	return d.g.model.MemoryMiB, nil
}

// NumaNode is the GPU's GPUSpec.NUMANode (0 unless set: one NUMA node).
func (d *device) NumaNode() (int, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("NumaNode")); err != nil {
		return 0, err
	}
	return d.g.numa, nil
}

func (d *device) MigMode() (current, pending bool, err error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("MigMode")); err != nil {
		return false, false, err
	}
	return d.g.migCurrent, d.g.migPending, nil
}

// SetMigMode switches MIG mode, at once or, with Options.MigModeNeedsReset, at the next
// ResetGPU. Turning MIG off while GIs exist is ERROR_IN_USE.
func (d *device) SetMigMode(enabled bool) error {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("SetMigMode", enabled)
	if err := d.check(op); err != nil {
		return err
	}
	if err := d.g.takeFault(OpSetMigMode, op); err != nil {
		return err
	}
	if !enabled && len(d.g.gis) > 0 {
		return nvml.Errorf(nvml.ErrorInUse, op, "%d GPU instances exist; destroy them first", len(d.g.gis))
	}
	d.g.migPending = enabled
	if !d.s.opts.MigModeNeedsReset {
		d.g.migCurrent = enabled
	}
	return d.s.persisted(op)
}

func profileInfo(p *config.Profile) nvml.GpuInstanceProfile {
	return nvml.GpuInstanceProfile{
		ID:            p.ID,
		Name:          p.Name,
		SliceCount:    p.ParsedName().Slices,
		InstanceCount: p.Instances,
		MemoryMiB:     p.MemoryMiB,
		SMs:           p.SMs,
	}
}

// GpuInstanceProfiles lists the model's profiles in GPU_INSTANCE_PROFILE_* index order, the
// order in which a real backend discovers them.
func (d *device) GpuInstanceProfiles() ([]nvml.GpuInstanceProfile, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("GpuInstanceProfiles")
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := d.g.checkMig(op); err != nil {
		return nil, err
	}
	ps := make([]*config.Profile, 0, len(d.g.model.Profiles))
	for i := range d.g.model.Profiles {
		ps = append(ps, &d.g.model.Profiles[i])
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].NVMLIndex < ps[j].NVMLIndex })
	out := make([]nvml.GpuInstanceProfile, len(ps))
	for i, p := range ps {
		out[i] = profileInfo(p)
	}
	return out, nil
}

// profile finds a profile by NVML id. An unknown id is ERROR_INVALID_ARGUMENT: NVML reports
// NOT_SUPPORTED for a profile index the GPU lacks, but an id that no profile has is a bad
// argument to every id-taking call, and callers should not mistake it for "MIG is off".
func (g *gpuState) profile(op string, id int) (*config.Profile, error) {
	p, ok := g.model.ProfileByID(id)
	if !ok {
		return nil, nvml.Errorf(nvml.ErrorInvalidArgument, op, "%s (%s) has no GPU-instance profile with id %d", g.uuid, g.model.Key, id)
	}
	return p, nil
}

func (d *device) GpuInstanceProfileByID(profileID int) (nvml.GpuInstanceProfile, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("GpuInstanceProfileByID", profileID)
	if err := d.check(op); err != nil {
		return nvml.GpuInstanceProfile{}, err
	}
	if err := d.g.checkMig(op); err != nil {
		return nvml.GpuInstanceProfile{}, err
	}
	p, err := d.g.profile(op, profileID)
	if err != nil {
		return nvml.GpuInstanceProfile{}, err
	}
	return profileInfo(p), nil
}

// GpuInstancePossiblePlacements lists every legal placement of the profile, whatever is in use.
func (d *device) GpuInstancePossiblePlacements(profileID int) ([]api.Placement, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("GpuInstancePossiblePlacements", fmt.Sprintf("profile %d", profileID))
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := d.g.checkMig(op); err != nil {
		return nil, err
	}
	p, err := d.g.profile(op, profileID)
	if err != nil {
		return nil, err
	}
	return p.Placements.List(), nil
}

// CreateGpuInstanceWithPlacement creates a GI of the profile at exactly that placement, under
// the hardware rules of the facts file (see the package doc).
func (d *device) CreateGpuInstanceWithPlacement(profileID int, pl api.Placement) (_ nvml.GpuInstance, err error) {
	d.s.waitHold(d.g, OpCreateGpuInstance)
	defer func() { d.s.runAfter(d.g, OpCreateGpuInstance, err) }()
	d.s.mu.Lock()
	if d.s.firstCreate.IsZero() {
		d.s.firstCreate = time.Now()
	}
	d.s.mu.Unlock()
	if latency := d.s.opts.CreateLatency; latency > 0 {
		d.g.creating.Lock()
		defer d.g.creating.Unlock()
		time.Sleep(latency)
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	g := d.g
	op := fmt.Sprintf("CreateGpuInstanceWithPlacement(%s, profile %d, %s)", g.uuid, profileID, pl)
	if p, ok := g.model.ProfileByID(profileID); ok {
		op = fmt.Sprintf("CreateGpuInstanceWithPlacement(%s, profile %d (%s), %s)", g.uuid, profileID, p.Name, pl)
	}
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := g.takeFault(OpCreateGpuInstance, op); err != nil {
		return nil, err
	}
	if err := g.checkMig(op); err != nil {
		return nil, err
	}
	p, err := g.profile(op, profileID)
	if err != nil {
		return nil, err
	}
	if pl.Size != p.Placements.Size || !slices.Contains(p.Placements.Starts, pl.Start) {
		return nil, nvml.Errorf(nvml.ErrorInvalidArgument, op, "%s is not a legal placement of %s; legal: %v",
			pl, p.Name, p.Placements.List())
	}
	if err := g.checkFits(op, p, pl); err != nil {
		return nil, err
	}
	id, ok := g.nextGIID()
	if !ok { // cannot happen while the pool exceeds maxInstances; kept as the driver would fail
		return nil, nvml.Errorf(nvml.ErrorInsufficientRes, op, "no free GPU-instance id")
	}
	gi := &giState{gpu: g, id: id, profile: p, name: p.ParsedName(), placement: pl, cis: map[int]*ciState{}}
	g.gis[id] = gi
	if err := d.s.persisted(op); err != nil {
		return nil, err
	}
	return &gpuInstance{s: d.s, gi: gi}, nil
}

// checkFits applies the resource rules to a legal placement; every refusal is
// ERROR_INSUFFICIENT_RESOURCES, as on the hardware. Callers hold s.mu.
func (g *gpuState) checkFits(op string, p *config.Profile, pl api.Placement) error {
	insufficient := func(format string, args ...any) error {
		return nvml.Errorf(nvml.ErrorInsufficientRes, op, format, args...)
	}
	variant := p.ParsedName().Variant
	same, slicesUsed := 0, 0
	for _, gi := range g.sortedGIs() {
		if gi.placement.Overlaps(pl) {
			return insufficient("overlaps GPU instance %d (%s at %s)", gi.id, gi.profile.Name, gi.placement)
		}
		if gi.profile.ID == p.ID {
			same++
		}
		slicesUsed += gi.name.Slices
	}
	if same >= p.Instances {
		return insufficient("%s allows %d instances and %d exist", p.Name, p.Instances, same)
	}
	for _, gi := range g.sortedGIs() {
		other := gi.name.Variant
		switch {
		case variant == "+me" && other == "+me":
			return insufficient("GPU instance %d (%s) already has the media engines a +me profile takes; one +me instance per GPU",
				gi.id, gi.profile.Name)
		case other == "+me.all" && variant != "-me":
			return insufficient("GPU instance %d (%s) holds every media engine; only -me profiles can be created beside it",
				gi.id, gi.profile.Name)
		case variant == "+me.all" && other != "-me":
			return insufficient("%s takes every media engine, but GPU instance %d (%s) is not a -me profile",
				p.Name, gi.id, gi.profile.Name)
		}
	}
	if len(g.gis) >= g.model.MaxInstances {
		return insufficient("%s allows %d GPU instances and %d exist", g.model.Key, g.model.MaxInstances, len(g.gis))
	}
	full := g.model.FullProfile().ParsedName().Slices
	if need := p.ParsedName().Slices; slicesUsed+need > full {
		return insufficient("%d of %d compute slices are in use; %s needs %d", slicesUsed, full, p.Name, need)
	}
	return nil
}

// nextGIID hands out the smallest free id after the last one, wrapping around the pool, as the
// driver does; callers hold s.mu.
func (g *gpuState) nextGIID() (int, bool) {
	for i := range g.giIDPool {
		id := (g.lastGIID+i)%g.giIDPool + 1
		if _, used := g.gis[id]; !used {
			g.lastGIID = id
			return id, true
		}
	}
	return 0, false
}

// GpuInstances lists the existing GIs in id order.
func (d *device) GpuInstances() ([]nvml.GpuInstance, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("GpuInstances")
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := d.g.checkMig(op); err != nil {
		return nil, err
	}
	var out []nvml.GpuInstance
	for _, gi := range d.g.sortedGIs() {
		out = append(out, &gpuInstance{s: d.s, gi: gi})
	}
	return out, nil
}

func (d *device) GpuInstanceByID(id int) (nvml.GpuInstance, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	op := d.op("GpuInstanceByID", id)
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := d.g.checkMig(op); err != nil {
		return nil, err
	}
	gi, ok := d.g.gis[id]
	if !ok {
		return nil, nvml.Errorf(nvml.ErrorNotFound, op, "no GPU instance %d", id)
	}
	return &gpuInstance{s: d.s, gi: gi}, nil
}

// MigDevices lists one MIG device per CI, by GI id and then CI id. With MIG mode off there are
// none, which is not an error.
func (d *device) MigDevices() ([]nvml.MigDevice, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.check(d.op("MigDevices")); err != nil {
		return nil, err
	}
	var out []nvml.MigDevice
	for _, gi := range d.g.sortedGIs() {
		for _, ci := range gi.sortedCIs() {
			out = append(out, &migDevice{s: d.s, ci: ci})
		}
	}
	return out, nil
}
