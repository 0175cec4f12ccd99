package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
)

// driverVersion is what DriverVersion reports: a current R580 production driver, recent
// enough for every rule of the facts file (4g@0 beside 3g@4 needs R510).
const driverVersion = "580.95.05"

// GPUSpec describes one simulated GPU.
type GPUSpec struct {
	// Model is a model key, an NVML name or a HAMi model string, resolved with
	// config.LookupModel.
	Model string
	// NVMLName is the name the GPU reports. Default: Model itself when it is one of the
	// model's NVML names (spelled as in the table), else the model's first NVML name.
	NVMLName string
	// UUID is the GPU UUID. Default: "GPU-…" hashed from Options.Seed and the GPU's index.
	UUID string
	// MigDisabled starts the GPU with MIG mode off; by default it is on.
	MigDisabled bool
	// NUMANode is the NUMA node the GPU is attached to (NumaNode).
	NUMANode int
}

// SetMIGModeFor starts each GPU with the MIG mode an admin leaves it in on a node of that
// operating mode: off on a hami-core node (CUDA cannot use a GPU in MIG mode whole), on
// otherwise.
func SetMIGModeFor(specs []GPUSpec, nodeMode string) {
	for i := range specs {
		specs[i].MigDisabled = nodeMode == api.ModeHAMiCore
	}
}

// Options tunes the whole simulator.
type Options struct {
	// Seed makes GPU and MIG UUIDs deterministic; a node name is a good seed.
	Seed string
	// MigModeNeedsReset keeps a SetMigMode change pending (MigMode reports current ≠ pending)
	// until ResetGPU, as on GPUs that need a reset to switch MIG mode.
	MigModeNeedsReset bool
	// CreateLatency is how long a GPU-instance create takes (HAMi's pull request 2910
	// reports about 1.5 s on real GPUs). Creates on one GPU run one after another, as the
	// driver serialises a GPU's mutation; creates on different GPUs overlap. 0: instant.
	CreateLatency time.Duration
	// StateFile, when set, keeps what the GPUs keep across processes (MIG mode, GPU and
	// compute instances, processes on them) in this file: New loads it when it exists, and
	// every change is written to it at once. A device plugin run in a pod on simulated GPUs
	// (--sim-state) finds, once its pod is made again, the instances it made before, as it
	// would on real GPUs.
	StateFile string
}

// Sim is a simulated NVML library with its GPUs. It implements nvml.Interface.
type Sim struct {
	mu   sync.Mutex
	opts Options
	// initCount counts Init calls not yet matched by Shutdown, as NVML does.
	initCount int
	initFault nvml.Return
	gpus      []*gpuState
	// migCounter numbers MIG devices ever created, so no MIG UUID is handed out twice.
	migCounter uint64
	// firstCreate is when the first GPU-instance create was asked for.
	firstCreate time.Time
	// eventSets are the event sets made (NewEventSet), freed ones included.
	eventSets []*eventSet
}

var _ nvml.Interface = (*Sim)(nil)

// gpuState is one GPU; guarded by Sim.mu like everything below it.
type gpuState struct {
	index      int
	uuid       string
	name       string
	model      *config.Model // the shared table: read only
	numa       int
	migCurrent bool
	migPending bool
	gis        map[int]*giState
	// lastGIID is the GI id handed out last; the next one is the smallest free id after it.
	lastGIID int
	giIDPool int
	faults   map[Op]nvml.Return
	// holds and afters are the test hooks HoldNext and AfterNext put on the GPU's next call
	// of an op.
	holds  map[Op]*Hold
	afters map[Op]func()
	// lost makes every call on the GPU but UUID answer ERROR_GPU_IS_LOST (LoseGPU).
	lost bool
	// resetPending is what ResetPending answers (SetResetPending).
	resetPending bool
	// creating serialises the GPU's creates while Options.CreateLatency passes; it is not
	// guarded by Sim.mu (other calls go on meanwhile).
	creating sync.Mutex
}

type giState struct {
	gpu       *gpuState
	id        int
	profile   *config.Profile // the shared table: read only
	name      api.ProfileName
	placement api.Placement
	cis       map[int]*ciState
	destroyed bool
}

type ciState struct {
	gi        *giState
	id        int
	profileID int
	migUUID   string
	procs     map[int]bool
	destroyed bool
}

// New builds a simulator with the given GPUs, indexed in order. An unknown model is an error
// that lists the known ones.
func New(opts Options, gpus ...GPUSpec) (*Sim, error) {
	s := &Sim{opts: opts}
	seen := map[string]int{}
	for i, spec := range gpus {
		m, ok := config.LookupModel(spec.Model)
		if !ok {
			return nil, fmt.Errorf("GPU %d: unknown model %q (known models: %s)",
				i, spec.Model, strings.Join(config.KnownModelNames(), ", "))
		}
		g := &gpuState{
			index:      i,
			uuid:       spec.UUID,
			name:       spec.NVMLName,
			model:      m,
			numa:       spec.NUMANode,
			migCurrent: !spec.MigDisabled,
			migPending: !spec.MigDisabled,
			gis:        map[int]*giState{},
			giIDPool:   giIDPoolSize(m),
			faults:     map[Op]nvml.Return{},
			holds:      map[Op]*Hold{},
			afters:     map[Op]func(){},
		}
		if g.name == "" {
			g.name = defaultNVMLName(m, spec.Model)
		}
		if g.uuid == "" {
			g.uuid = "GPU-" + hashUUID("gpu", opts.Seed, fmt.Sprint(i))
		}
		if j, dup := seen[g.uuid]; dup {
			return nil, fmt.Errorf("GPU %d: UUID %s is already GPU %d's", i, g.uuid, j)
		}
		seen[g.uuid] = i
		s.gpus = append(s.gpus, g)
	}
	if s.opts.StateFile != "" {
		if err := s.restore(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// defaultNVMLName is the table's spelling of name when name is one of the model's NVML names
// (with or without "NVIDIA "), else the model's first NVML name.
func defaultNVMLName(m *config.Model, name string) string {
	name = strings.TrimSpace(name)
	for _, n := range m.NVMLNames {
		if strings.EqualFold(name, n) || strings.EqualFold(name, strings.TrimPrefix(n, "NVIDIA ")) {
			return n
		}
	}
	return m.NVMLNames[0]
}

// giIDPoolSize is how many GI ids the driver hands out on the model: 1..14 is what 8-slot GPUs
// show, 1..6 the 12-slot RTX PRO 6000; for others twice the instance limit is a guess.
func giIDPoolSize(m *config.Model) int {
	switch m.Slots {
	case 8:
		return 14
	case 12:
		return 6
	}
	return 2 * m.MaxInstances
}

// hashUUID formats the SHA-256 of its parts as 8-4-4-4-12 hex digits.
func hashUUID(parts ...string) string {
	sum := sha256.Sum256([]byte("dynamig-sim\x00" + strings.Join(parts, "\x00")))
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// Init opens the simulated library, or fails as FailInit said.
func (s *Sim) Init() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.initFault != nvml.Success {
		detail := "injected fault"
		if s.initFault == nvml.ErrorLibraryNotFound {
			detail = "libnvidia-ml.so.1 not found: is the NVIDIA driver installed? (simulated)"
		}
		return nvml.Errorf(s.initFault, "Init", "%s", detail)
	}
	s.initCount++
	return nil
}

// Shutdown undoes one Init; after the last, every call answers ERROR_UNINITIALIZED.
func (s *Sim) Shutdown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkInit("Shutdown"); err != nil {
		return err
	}
	s.initCount--
	return nil
}

// checkInit fails unless Init succeeded; callers hold s.mu.
func (s *Sim) checkInit(op string) error {
	if s.initCount == 0 {
		return nvml.Errorf(nvml.ErrorUninitialized, op, "NVML is not initialized: call Init first")
	}
	return nil
}

// DriverVersion reports a fixed driver version.
func (s *Sim) DriverVersion() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkInit("DriverVersion"); err != nil {
		return "", err
	}
	return driverVersion, nil
}

// DeviceCount is the number of simulated GPUs.
func (s *Sim) DeviceCount() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkInit("DeviceCount"); err != nil {
		return 0, err
	}
	return len(s.gpus), nil
}

// DeviceByIndex returns a GPU; an index out of range is ERROR_INVALID_ARGUMENT, as in NVML.
func (s *Sim) DeviceByIndex(index int) (nvml.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := fmt.Sprintf("DeviceByIndex(%d)", index)
	if err := s.checkInit(op); err != nil {
		return nil, err
	}
	if index < 0 || index >= len(s.gpus) {
		return nil, nvml.Errorf(nvml.ErrorInvalidArgument, op, "there are %d GPUs", len(s.gpus))
	}
	return &device{s: s, g: s.gpus[index]}, nil
}

// Op names a call that FailNext can make fail.
type Op int

// The calls FailNext can make fail.
const (
	OpCreateGpuInstance Op = iota + 1
	OpCreateComputeInstance
	OpDestroyGpuInstance
	OpDestroyComputeInstance
	OpSetMigMode
)

func (o Op) String() string {
	switch o {
	case OpCreateGpuInstance:
		return "CreateGpuInstance"
	case OpCreateComputeInstance:
		return "CreateComputeInstance"
	case OpDestroyGpuInstance:
		return "DestroyGpuInstance"
	case OpDestroyComputeInstance:
		return "DestroyComputeInstance"
	case OpSetMigMode:
		return "SetMigMode"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// FailNext makes the next call of op on the GPU fail with code, changing nothing; the fault
// then clears. A later FailNext for the same GPU and op replaces it; nvml.Success removes it.
// An index out of range panics: it is a bug in the test.
func (s *Sim) FailNext(gpuIndex int, op Op, code nvml.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mustGPU(gpuIndex)
	if code == nvml.Success {
		delete(g.faults, op)
		return
	}
	g.faults[op] = code
}

// takeFault consumes an injected fault of op, returning the error to answer with; callers
// hold s.mu.
func (g *gpuState) takeFault(op Op, call string) error {
	code, ok := g.faults[op]
	if !ok {
		return nil
	}
	delete(g.faults, op)
	return nvml.Errorf(code, call, "injected fault (FailNext %s)", op)
}

func (s *Sim) mustGPU(index int) *gpuState {
	if index < 0 || index >= len(s.gpus) {
		panic(fmt.Sprintf("sim: GPU index %d out of range (%d GPUs)", index, len(s.gpus)))
	}
	return s.gpus[index]
}

func (s *Sim) gpu(index int) (*gpuState, error) {
	if index < 0 || index >= len(s.gpus) {
		return nil, fmt.Errorf("sim: GPU index %d out of range (%d GPUs)", index, len(s.gpus))
	}
	return s.gpus[index], nil
}

// Hold is a call HoldNext stops before it does anything.
type Hold struct {
	reached, done chan struct{}
	abandon       bool // read after done closes
	once          sync.Once
}

// Reached is closed when the held call arrives.
func (h *Hold) Reached() <-chan struct{} { return h.reached }

// Release lets the held call go on.
func (h *Hold) Release() { h.once.Do(func() { close(h.done) }) }

// Abandon ends the held call's goroutine where it stands (runtime.Goexit: only its deferred
// calls run) and it never returns to its caller, as when its process is killed at that step.
func (h *Hold) Abandon() {
	h.once.Do(func() {
		h.abandon = true
		close(h.done)
	})
}

// HoldNext makes the next call of op on the GPU wait, before it does anything, until the
// test releases or abandons it: tests stop a component between two steps this way. An index
// out of range panics.
func (s *Sim) HoldNext(gpuIndex int, op Op) *Hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &Hold{reached: make(chan struct{}), done: make(chan struct{})}
	s.mustGPU(gpuIndex).holds[op] = h
	return h
}

// AfterNext runs fn once the next call of op on the GPU has succeeded, before the call
// returns to its caller (and without the simulator's lock, so fn may call it). fn may end
// the caller's goroutine with runtime.Goexit, as a kill right after the call would.
func (s *Sim) AfterNext(gpuIndex int, op Op, fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mustGPU(gpuIndex).afters[op] = fn
}

// waitHold blocks a call of op while a HoldNext holds it; callers do not hold s.mu.
func (s *Sim) waitHold(g *gpuState, op Op) {
	s.mu.Lock()
	h := g.holds[op]
	delete(g.holds, op)
	s.mu.Unlock()
	if h != nil {
		close(h.reached)
		<-h.done
		if h.abandon {
			runtime.Goexit()
		}
	}
}

// runAfter runs the AfterNext hook of op if the call succeeded; callers do not hold s.mu.
func (s *Sim) runAfter(g *gpuState, op Op, err error) {
	if err != nil {
		return
	}
	s.mu.Lock()
	fn := g.afters[op]
	delete(g.afters, op)
	s.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// FailInit makes every Init fail with code until FailInit(nvml.Success). Sessions already
// open stay open.
func (s *Sim) FailInit(code nvml.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initFault = code
}

// LoseGpuInstance removes a GI with its CIs and their processes behind the caller's back, as an
// operator or a GPU reset would. Handles to them answer ERROR_NOT_FOUND from then on.
func (s *Sim) LoseGpuInstance(gpuIndex, giID int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.gpu(gpuIndex)
	if err != nil {
		return err
	}
	gi, ok := g.gis[giID]
	if !ok {
		return fmt.Errorf("sim: GPU %d (%s) has no GPU instance %d", gpuIndex, g.uuid, giID)
	}
	gi.remove()
	return s.persist()
}

// remove drops the GI and everything in it; callers hold s.mu.
func (gi *giState) remove() {
	for id, ci := range gi.cis {
		ci.destroyed = true
		delete(gi.cis, id)
	}
	gi.destroyed = true
	delete(gi.gpu.gis, gi.id)
}

// findCI finds a live CI by MIG UUID; callers hold s.mu.
func (s *Sim) findCI(migUUID string) (*ciState, error) {
	for _, g := range s.gpus {
		for _, gi := range g.gis {
			for _, ci := range gi.cis {
				if ci.migUUID == migUUID {
					return ci, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("sim: no MIG device %q", migUUID)
}

// AddProcess starts a compute process with that PID on a MIG device.
func (s *Sim) AddProcess(migUUID string, pid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pid <= 0 {
		return fmt.Errorf("sim: PID %d must be positive", pid)
	}
	ci, err := s.findCI(migUUID)
	if err != nil {
		return err
	}
	if ci.procs[pid] {
		return fmt.Errorf("sim: PID %d already runs on %s", pid, migUUID)
	}
	ci.procs[pid] = true
	return s.persist()
}

// RemoveProcess ends a compute process on a MIG device.
func (s *Sim) RemoveProcess(migUUID string, pid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ci, err := s.findCI(migUUID)
	if err != nil {
		return err
	}
	if !ci.procs[pid] {
		return fmt.Errorf("sim: PID %d does not run on %s", pid, migUUID)
	}
	delete(ci.procs, pid)
	return s.persist()
}

// ResetGPU resets a GPU: a pending MIG mode takes effect and, as on real hardware, every GI
// and CI is gone afterwards (their handles answer ERROR_NOT_FOUND) and GI ids start over. It
// fails with ERROR_IN_USE while compute processes run on the GPU.
func (s *Sim) ResetGPU(gpuIndex int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.gpu(gpuIndex)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("ResetGPU(%s)", g.uuid)
	for _, gi := range g.gis {
		for _, ci := range gi.cis {
			if len(ci.procs) > 0 {
				return nvml.Errorf(nvml.ErrorInUse, op, "%d processes run on %s", len(ci.procs), ci.migUUID)
			}
		}
	}
	for _, gi := range g.gis {
		gi.remove()
	}
	g.lastGIID = 0
	g.migCurrent = g.migPending
	return s.persist()
}

// GPUState is one GPU in a Snapshot.
type GPUState struct {
	Index int
	UUID  string
	Name  string
	// Model is the model key.
	Model      string
	MigEnabled bool
	// MigPending is the MIG mode after the next ResetGPU.
	MigPending   bool
	GpuInstances []GpuInstanceState
}

// GpuInstanceState is one GI in a Snapshot.
type GpuInstanceState struct {
	ID               int
	ProfileID        int
	ProfileName      string
	Placement        api.Placement
	ComputeInstances []ComputeInstanceState
}

// ComputeInstanceState is one CI in a Snapshot.
type ComputeInstanceState struct {
	ID        int
	MigUUID   string
	Processes []int
}

// LoseGPU makes the GPU fall off the bus as far as NVML can tell: every call on it except
// UUID answers ERROR_GPU_IS_LOST until RecoverGPU.
func (s *Sim) LoseGPU(gpuIndex int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus[gpuIndex].lost = true
}

// RecoverGPU undoes LoseGPU.
func (s *Sim) RecoverGPU(gpuIndex int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus[gpuIndex].lost = false
}

// FirstCreate is when the first GPU-instance create was asked for (zero before one was).
func (s *Sim) FirstCreate() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstCreate
}

// Snapshot reports every GPU in index order, its GIs in id order, their CIs in id order and
// their processes in PID order. It needs no Init.
func (s *Sim) Snapshot() []GPUState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]GPUState, 0, len(s.gpus))
	for _, g := range s.gpus {
		gs := GPUState{
			Index: g.index, UUID: g.uuid, Name: g.name, Model: g.model.Key,
			MigEnabled: g.migCurrent, MigPending: g.migPending,
		}
		for _, gi := range g.sortedGIs() {
			gis := GpuInstanceState{
				ID: gi.id, ProfileID: gi.profile.ID, ProfileName: gi.profile.Name, Placement: gi.placement,
			}
			for _, ci := range gi.sortedCIs() {
				gis.ComputeInstances = append(gis.ComputeInstances, ComputeInstanceState{
					ID: ci.id, MigUUID: ci.migUUID, Processes: ci.pids(),
				})
			}
			gs.GpuInstances = append(gs.GpuInstances, gis)
		}
		out = append(out, gs)
	}
	return out
}

func (g *gpuState) sortedGIs() []*giState {
	out := make([]*giState, 0, len(g.gis))
	for _, gi := range g.gis {
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (gi *giState) sortedCIs() []*ciState {
	out := make([]*ciState, 0, len(gi.cis))
	for _, ci := range gi.cis {
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (ci *ciState) pids() []int {
	var out []int // nil when none, so snapshots compare equal
	for pid := range ci.procs {
		out = append(out, pid)
	}
	sort.Ints(out)
	return out
}
