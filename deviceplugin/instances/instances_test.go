package instances

import (
	"context"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
)

func newManager(t *testing.T, models ...string) (*Manager, *sim.Sim) {
	t.Helper()
	var specs []sim.GPUSpec
	for _, m := range models {
		specs = append(specs, sim.GPUSpec{Model: m})
	}
	s, err := sim.New(sim.Options{Seed: "node"}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	m, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

func pl(start, size int) api.Placement { return api.Placement{Start: start, Size: size} }

func TestCreateListDestroy(t *testing.T) {
	ctx := context.Background()
	m, s := newManager(t, "NVIDIA A100-PCIE-40GB")
	gpu := m.GPUs()[0]
	unlock, err := m.Lock(gpu)
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Create(ctx, gpu, "2g.10gb", pl(0, 2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, gpu, "2g.10gb", pl(2, 2))
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !a.Complete || !strings.HasPrefix(a.MigUUID, "MIG-") || a.MigUUID == b.MigUUID || a.ProfileID != 14 {
		t.Errorf("instances: %+v %+v", a, b)
	}
	list, err := m.List(gpu)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Profile != "2g.10gb" || !list[0].Complete {
		t.Fatalf("list: %+v", list)
	}
	if err := m.Destroy(ctx, gpu, a.GPUInstanceID); err != nil {
		t.Fatal(err)
	}
	if got := s.Snapshot()[0].GpuInstances; len(got) != 1 || got[0].Placement != pl(2, 2) {
		t.Errorf("after destroy: %+v", got)
	}
}

func TestCreateRefusals(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t, "A100-40GB")
	gpu := m.GPUs()[0]
	if _, err := m.Create(ctx, gpu, "3g.20gb", pl(0, 4)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		profile string
		at      api.Placement
		want    string
	}{
		{"2g.10gb", pl(2, 2), "INSUFFICIENT_RESOURCES"},
		{"2g.10gb", pl(1, 2), "not legal"},
		{"9g.99gb", pl(0, 8), "no MIG profile 9g.99gb"},
	} {
		if _, err := m.Create(ctx, gpu, tc.profile, tc.at); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s at %s: %v, want %q", tc.profile, tc.at, err, tc.want)
		}
	}
	if _, err := m.Create(ctx, "GPU-nope", "1g.5gb", pl(0, 1)); err == nil || !strings.Contains(err.Error(), "not on this node") {
		t.Errorf("unknown GPU: %v", err)
	}
}

// TestFailedComputeInstanceLeavesNoGPUInstance injects a CI failure after the GI was made.
func TestFailedComputeInstanceLeavesNoGPUInstance(t *testing.T) {
	m, s := newManager(t, "A100-40GB")
	gpu := m.GPUs()[0]
	s.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorInsufficientRes)
	_, err := m.Create(context.Background(), gpu, "1g.5gb", pl(6, 1))
	if err == nil || !nvml.IsCode(err, nvml.ErrorInsufficientRes) {
		t.Fatalf("want the CI failure, got %v", err)
	}
	if gis := s.Snapshot()[0].GpuInstances; len(gis) != 0 {
		t.Errorf("a GI was left behind: %+v", gis)
	}
	// A failed rollback is reported as well.
	s.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorUnknown)
	s.FailNext(0, sim.OpDestroyGpuInstance, nvml.ErrorUnknown)
	_, err = m.Create(context.Background(), gpu, "1g.5gb", pl(6, 1))
	if err == nil || !strings.Contains(err.Error(), "rollback") {
		t.Errorf("rollback failure must be reported: %v", err)
	}
}

func TestDestroyWithProcessIsRefused(t *testing.T) {
	ctx := context.Background()
	m, s := newManager(t, "A100-40GB")
	gpu := m.GPUs()[0]
	in, err := m.Create(ctx, gpu, "1g.5gb", pl(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddProcess(in.MigUUID, 4242); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, gpu, in.GPUInstanceID); !nvml.IsCode(err, nvml.ErrorInUse) {
		t.Fatalf("destroy with a process: %v", err)
	}
	list, _ := m.List(gpu)
	if len(list) != 1 || !list[0].Complete || len(list[0].Processes) != 1 {
		t.Errorf("the instance must be intact: %+v", list)
	}
}

func TestVariantsByExactName(t *testing.T) {
	m, _ := newManager(t, "NVIDIA H100 80GB HBM3")
	gpu := m.GPUs()[0]
	in, err := m.Create(context.Background(), gpu, "1g.20gb", pl(2, 2))
	if err != nil {
		t.Fatal(err)
	}
	if in.ProfileID != 15 {
		t.Errorf("1g.20gb is profile id 15, got %d", in.ProfileID)
	}
	me, err := m.Create(context.Background(), gpu, "1g.10gb+me", pl(0, 1))
	if err != nil || me.ProfileID != 20 {
		t.Errorf("1g.10gb+me: %+v %v", me, err)
	}
}

func TestListHalfMadeInstance(t *testing.T) {
	m, s := newManager(t, "A100-40GB")
	dev, _ := s.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(19, pl(3, 1)); err != nil {
		t.Fatal(err)
	}
	list, err := m.List(m.GPUs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Complete || list[0].ComputeInstanceID != -1 || list[0].Profile != "1g.5gb" {
		t.Errorf("half-made: %+v", list)
	}
}

// unidentified makes GPU index bad of the library unidentifiable: its handle, or its UUID,
// fails as NVML does for a GPU it cannot initialise.
type unidentified struct {
	nvml.Interface
	bad    int
	handle bool // the handle fails, else the UUID
}

func (u unidentified) DeviceByIndex(i int) (nvml.Device, error) {
	if i == u.bad && u.handle {
		return nil, nvml.Errorf(nvml.ErrorUnknown, "DeviceByIndex", "injected")
	}
	d, err := u.Interface.DeviceByIndex(i)
	if i == u.bad {
		return noUUID{d}, err
	}
	return d, err
}

type noUUID struct{ nvml.Device }

func (noUUID) UUID() (string, error) { return "", nvml.Errorf(nvml.ErrorUnknown, "UUID", "injected") }

// TestUnidentifiableGPUIsLeftOut: one GPU NVML cannot identify (no handle, or no UUID) is left
// out, as the inventory leaves it out, and the node's other GPUs are served; an unusable
// library still stops the manager.
func TestUnidentifiableGPUIsLeftOut(t *testing.T) {
	_, s := newManager(t, "NVIDIA A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB")
	for _, handle := range []bool{true, false} {
		m, err := New(unidentified{Interface: s, bad: 0, handle: handle})
		if err != nil {
			t.Fatalf("handle fails %v: %v", handle, err)
		}
		want, _ := s.DeviceByIndex(1)
		uuid, _ := want.UUID()
		if gpus := m.GPUs(); len(gpus) != 1 || gpus[0] != uuid {
			t.Errorf("handle fails %v: GPUs %v, want only %s", handle, gpus, uuid)
		}
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(s); err == nil {
		t.Error("an uninitialised library must stop the manager")
	}
}
