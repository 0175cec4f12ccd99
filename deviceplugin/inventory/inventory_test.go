package inventory

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
)

func discover(t *testing.T, cfg *config.DeviceConfig, node string, specs ...sim.GPUSpec) *Result {
	t.Helper()
	s, err := sim.New(sim.Options{Seed: node}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	res, err := Discover(context.Background(), s, cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// placements lists placements of one size at the given starts.
func placements(size int, starts ...int) []api.Placement {
	return config.PlacementSet{Starts: starts, Size: size}.List()
}

// TestEveryModelPublishesItsDefaultProfiles checks the published profiles of every model
// and NVML name against the model table (itself tested equal to the facts file).
func TestEveryModelPublishesItsDefaultProfiles(t *testing.T) {
	for _, m := range config.Models() {
		for _, nvmlName := range m.NVMLNames {
			t.Run(nvmlName, func(t *testing.T) {
				res := discover(t, config.DefaultDeviceConfig(), "n1", sim.GPUSpec{Model: nvmlName})
				if len(res.GPUs) != 1 || len(res.Findings) != 0 {
					t.Fatalf("gpus %v findings %v", res.GPUs, res.Findings)
				}
				g := res.GPUs[0]
				full := m.FullProfile()
				if g.Mode != api.ModeMIG || g.Type != nvmlName || g.Model != m.Key || g.Slots != m.Slots ||
					g.Devmem != full.MemoryMiB || g.Devcore != 100 || !g.Health || !strings.HasPrefix(g.ID, "GPU-") {
					t.Errorf("gpu: %+v", g)
				}
				var names []string
				for _, p := range g.MigProfiles {
					names = append(names, p.Name)
					want, ok := m.Profile(p.Name)
					if !ok {
						t.Fatalf("published %s, not a profile of %s", p.Name, m.Key)
					}
					core := (want.SMs*100 + full.SMs - 1) / full.SMs
					if p.MemoryMB != want.MemoryMiB || p.Core != core || p.Instances != want.Instances ||
						p.SliceCount != want.ParsedName().Slices || !reflect.DeepEqual(p.Placements, want.Placements.List()) {
						t.Errorf("%s: published %+v; facts %+v (core %d)", p.Name, p, want, core)
					}
				}
				// config's tests hold the default allowlist to docs/architecture.md's table.
				want, _ := config.DefaultDeviceConfig().Nvidia.AllowedProfiles(nvmlName)
				if len(want) == 0 || !reflect.DeepEqual(names, want) {
					t.Errorf("profiles %v, want %v", names, want)
				}
				if g.Count != m.Profiles[0].Instances && g.Count != m.MaxInstances {
					t.Errorf("count %d", g.Count)
				}
				if _, err := api.EncodeInventory(res.GPUs); err != nil {
					t.Errorf("inventory does not validate: %v", err)
				}
			})
		}
	}
}

func TestA100SeedInventory(t *testing.T) {
	res := discover(t, config.DefaultDeviceConfig(), "mig-node", sim.GPUSpec{Model: "NVIDIA A100-PCIE-40GB"})
	g := res.GPUs[0]
	want := []api.MigProfile{
		{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Instances: 7, Placements: placements(1, 0, 1, 2, 3, 4, 5, 6)},
		{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Instances: 3, Placements: placements(2, 0, 2, 4)},
		{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Instances: 2, Placements: placements(4, 0, 4)},
		{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Instances: 1, Placements: placements(8, 0)},
	}
	if !reflect.DeepEqual(g.MigProfiles, want) || g.Count != 7 || g.Devmem != 40192 {
		t.Errorf("A100-40GB inventory:\n%+v\nwant\n%+v", g, want)
	}
}

func TestNodeConfig(t *testing.T) {
	cfg, err := config.ParseDeviceConfig([]byte(`
nvidia:
  deviceSplitCount: 4
  deviceMemoryScaling: 1.5
nodeconfig:
- name: core-node
  operatingmode: hami-core
  filterdevices:
    index: [1]
- name: mig-node
  operatingmode: mig
`))
	if err != nil {
		t.Fatal(err)
	}
	res := discover(t, cfg, "core-node", sim.GPUSpec{Model: "A100-40GB", MigDisabled: true}, sim.GPUSpec{Model: "A100-40GB", MigDisabled: true})
	if len(res.GPUs) != 1 || len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "excluded") {
		t.Fatalf("filter: %+v %v", res.GPUs, res.Findings)
	}
	g := res.GPUs[0]
	if g.Mode != api.ModeHAMiCore || g.Count != 4 || g.Devmem != 40960*3/2 || g.Devcore != 100 || len(g.MigProfiles) != 0 || g.Unusable != "" {
		t.Errorf("hami-core GPU: %+v", g)
	}
	// A hami-core node whose GPU has MIG mode on publishes it unusable (no shares), and
	// says why.
	res = discover(t, cfg, "core-node", sim.GPUSpec{Model: "A100-40GB"})
	if g := res.GPUs[0]; g.Mode != api.ModeHAMiCore || g.Count != 0 || !strings.Contains(g.Unusable, "MIG mode is on") ||
		len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "unusable: MIG mode is on") {
		t.Errorf("hami-core with MIG on: %+v %v", res.GPUs, res.Findings)
	}
	// A mig node whose GPU has MIG mode off publishes it without profiles, unusable, and
	// says why.
	res = discover(t, cfg, "mig-node", sim.GPUSpec{Model: "A100-40GB", MigDisabled: true})
	if g := res.GPUs[0]; g.Mode != api.ModeMIG || len(g.MigProfiles) != 0 || g.Count != 0 || !strings.Contains(g.Unusable, "MIG mode is off") ||
		len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "MIG mode is off") {
		t.Errorf("MIG off: %+v %v", res.GPUs, res.Findings)
	}
	// Unnamed nodes follow the GPU's MIG mode.
	res = discover(t, cfg, "other", sim.GPUSpec{Model: "A100-40GB", MigDisabled: true}, sim.GPUSpec{Model: "A100-40GB"})
	if res.GPUs[0].Mode != api.ModeHAMiCore || res.GPUs[1].Mode != api.ModeMIG {
		t.Errorf("auto mode: %s %s", res.GPUs[0].Mode, res.GPUs[1].Mode)
	}
}

func TestAllowlistVariantsResolvedByName(t *testing.T) {
	cfg, err := config.ParseDeviceConfig([]byte(`
nvidia:
  migProfileAllowlist:
  - models: [H100-80GB]
    profiles: [1g.10gb, 1g.20gb, 1g.10gb+me, 7g.80gb]
  - models: [A100-80GB]
    profiles: [1g.10gb, 7g.79gb]
`))
	if err != nil {
		t.Fatal(err)
	}
	res := discover(t, cfg, "n", sim.GPUSpec{Model: "NVIDIA H100 80GB HBM3"}, sim.GPUSpec{Model: "A100-80GB"}, sim.GPUSpec{Model: "A30"})
	h100 := res.GPUs[0].MigProfiles
	// 1g.20gb is its own profile (id 15, 20096 MiB, 26 SMs), not 1g.10gb's memory.
	if len(h100) != 4 || h100[2].Name != "1g.20gb" || h100[2].MemoryMB != 20096 || h100[2].Core != 20 ||
		!reflect.DeepEqual(h100[2].Placements, placements(2, 0, 2, 4, 6)) || h100[1].Name != "1g.10gb+me" || h100[1].Instances != 1 {
		t.Errorf("H100 variants: %+v", h100)
	}
	if a100 := res.GPUs[1].MigProfiles; len(a100) != 2 || a100[1].Name != "7g.80gb" {
		t.Errorf("A100-80GB 7g.79gb alias: %+v", a100)
	}
	if len(res.GPUs[2].MigProfiles) != 0 || len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "no migProfileAllowlist entry") {
		t.Errorf("A30 without an entry: %+v %v", res.GPUs[2], res.Findings)
	}
}

func TestNVMLErrorsPropagate(t *testing.T) {
	s, _ := sim.New(sim.Options{}, sim.GPUSpec{Model: "A30"})
	// Not initialised: every call fails with NVML's code, and Discover returns it.
	if _, err := Discover(context.Background(), s, config.DefaultDeviceConfig(), "n"); !nvml.IsCode(err, nvml.ErrorUninitialized) {
		t.Errorf("got %v", err)
	}
}

func TestLostGPUPublishedUnhealthy(t *testing.T) {
	s, _ := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"}, sim.GPUSpec{Model: "A100-40GB"})
	s.Init()
	s.LoseGPU(1)
	res, err := Discover(context.Background(), s, config.DefaultDeviceConfig(), "n")
	if err != nil {
		t.Fatalf("one lost GPU must not fail discovery: %v", err)
	}
	if len(res.GPUs) != 2 || !res.GPUs[0].Health || res.GPUs[1].Health || res.GPUs[1].Count != 1 ||
		len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "GPU_IS_LOST") {
		t.Fatalf("gpus %+v findings %v", res.GPUs, res.Findings)
	}
	if _, err := api.EncodeInventory(res.GPUs); err != nil {
		t.Errorf("the inventory must stay valid: %v", err)
	}
}

// noHandle fails the handle of GPU bad, as NVML does for a GPU it cannot initialise.
type noHandle struct {
	nvml.Interface
	bad int
}

func (n noHandle) DeviceByIndex(i int) (nvml.Device, error) {
	if i == n.bad {
		return nil, nvml.Errorf(nvml.ErrorUnknown, "DeviceByIndex", "injected")
	}
	return n.Interface.DeviceByIndex(i)
}

// TestUnidentifiableGPUNotPublished: a GPU NVML gives no handle for is left out with a
// finding; the node's other GPUs are published.
func TestUnidentifiableGPUNotPublished(t *testing.T) {
	s, _ := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"}, sim.GPUSpec{Model: "A30"})
	s.Init()
	res, err := Discover(context.Background(), noHandle{Interface: s, bad: 0}, config.DefaultDeviceConfig(), "n")
	if err != nil {
		t.Fatalf("one unidentifiable GPU must not fail discovery: %v", err)
	}
	if len(res.GPUs) != 1 || !strings.Contains(res.GPUs[0].Type, "A30") || len(res.Findings) != 1 || !strings.Contains(res.Findings[0], "cannot be identified") {
		t.Fatalf("gpus %+v findings %v", res.GPUs, res.Findings)
	}
}
