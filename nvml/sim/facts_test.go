package sim

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

// The simulator is checked against the facts file itself, parsed here on its own (not with the
// config package's parser), so a parser bug there cannot hide a simulator bug here.

type factsFile struct {
	Models []factModel `yaml:"models"`
}

type factModel struct {
	Model        string        `yaml:"model"`
	NVMLNames    []string      `yaml:"nvmlNames"`
	MemoryMiB    int           `yaml:"memoryMiB"`
	SMs          int           `yaml:"sms"`
	Slots        int           `yaml:"slots"`
	MaxInstances int           `yaml:"maxInstances"`
	Profiles     []factProfile `yaml:"profiles"`
}

type factProfile struct {
	Name       string `yaml:"name"`
	ID         int    `yaml:"id"`
	NVMLIndex  int    `yaml:"nvmlIndex"`
	Instances  int    `yaml:"instances"`
	MemoryMiB  int    `yaml:"memoryMiB"`
	SMs        int    `yaml:"sms"`
	Placements struct {
		Starts []int `yaml:"starts"`
		Size   int   `yaml:"size"`
	} `yaml:"placements"`
}

var factSlicesRE = regexp.MustCompile(`^([0-9]+)g\.`)

// slices is the "Ng" number of the profile name.
func (p factProfile) slices(t *testing.T) int {
	m := factSlicesRE.FindStringSubmatch(p.Name)
	if m == nil {
		t.Fatalf("facts file: profile name %q has no slice count", p.Name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func (p factProfile) placements() []api.Placement {
	var out []api.Placement
	for _, s := range p.Placements.Starts {
		out = append(out, api.Placement{Start: s, Size: p.Placements.Size})
	}
	return out
}

// fullSlices is the slice count of the full-GPU profile: the variant-free one spanning every slot.
func (m factModel) fullSlices(t *testing.T) int {
	for _, p := range m.Profiles {
		if p.Placements.Size == m.Slots && regexp.MustCompile(`^[0-9]+g\.[0-9]+gb$`).MatchString(p.Name) {
			return p.slices(t)
		}
	}
	t.Fatalf("facts file: model %s has no full-GPU profile", m.Model)
	return 0
}

func loadFacts(t *testing.T) factsFile {
	t.Helper()
	_, here, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatalf("cannot locate the test source file to find the facts file")
	}
	path := filepath.Join(filepath.Dir(here), "..", "..", "config", "mig-hardware.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the MIG facts file must be at %s: %v", path, err)
	}
	var f factsFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	if len(f.Models) == 0 {
		t.Fatalf("%s lists no models", path)
	}
	return f
}

// simDevice starts a one-GPU simulator and returns its device.
func simDevice(t *testing.T, opts Options, spec GPUSpec) (*Sim, nvml.Device) {
	t.Helper()
	s, err := New(opts, spec)
	if err != nil {
		t.Fatalf("New(%+v): %v", spec, err)
	}
	if err := s.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	d, err := s.DeviceByIndex(0)
	if err != nil {
		t.Fatalf("DeviceByIndex(0): %v", err)
	}
	return s, d
}

// wantCI is the COMPUTE_INSTANCE_PROFILE index of a profile's full-GI CI, per the facts file's
// header: by slice count, except the double-memory 1g (REV2, index 9) whose CI is 1_SLICE_REV1.
func wantCI(t *testing.T, p factProfile) int {
	if p.NVMLIndex == 9 {
		return 7
	}
	ci, ok := map[int]int{1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[p.slices(t)]
	if !ok {
		t.Fatalf("profile %s: no CI profile for %d slices", p.Name, p.slices(t))
	}
	return ci
}

func TestMatchesFactsFile(t *testing.T) {
	for _, m := range loadFacts(t).Models {
		for _, name := range m.NVMLNames {
			t.Run(name, func(t *testing.T) {
				_, d := simDevice(t, Options{Seed: "facts"}, GPUSpec{Model: name})
				if got, _ := d.Name(); got != name {
					t.Errorf("Name = %q, want %q", got, name)
				}
				if got, _ := d.MemoryMiB(); got != m.MemoryMiB {
					t.Errorf("MemoryMiB = %d, want %d", got, m.MemoryMiB)
				}
				checkProfiles(t, m, d)
				for _, p := range m.Profiles {
					t.Run(p.Name, func(t *testing.T) {
						checkPlacements(t, m, p, name)
						checkFill(t, m, p, name)
					})
				}
			})
		}
	}
}

func checkProfiles(t *testing.T, m factModel, d nvml.Device) {
	got, err := d.GpuInstanceProfiles()
	if err != nil {
		t.Fatalf("GpuInstanceProfiles: %v", err)
	}
	var want []nvml.GpuInstanceProfile
	for _, p := range m.Profiles {
		want = append(want, nvml.GpuInstanceProfile{
			ID: p.ID, Name: p.Name, SliceCount: p.slices(t), InstanceCount: p.Instances, MemoryMiB: p.MemoryMiB, SMs: p.SMs,
		})
	}
	byID := func(ps []nvml.GpuInstanceProfile) {
		sort.Slice(ps, func(i, j int) bool { return ps[i].ID < ps[j].ID })
	}
	byID(got)
	byID(want)
	if !slices.Equal(got, want) {
		t.Errorf("GpuInstanceProfiles:\n got %+v\nwant %+v", got, want)
	}
	for _, p := range want {
		if got, err := d.GpuInstanceProfileByID(p.ID); err != nil || got != p {
			t.Errorf("GpuInstanceProfileByID(%d) = %+v, %v; want %+v", p.ID, got, err, p)
		}
	}
}

// checkPlacements creates the profile at every legal placement of an empty GPU and refuses it
// at every other (start, size).
func checkPlacements(t *testing.T, m factModel, p factProfile, name string) {
	_, d := simDevice(t, Options{Seed: "facts"}, GPUSpec{Model: name})
	legal := p.placements()
	got, err := d.GpuInstancePossiblePlacements(p.ID)
	if err != nil || !slices.Equal(got, legal) {
		t.Errorf("GpuInstancePossiblePlacements(%d) = %v, %v; want %v", p.ID, got, err, legal)
	}
	for _, pl := range legal {
		gi, err := d.CreateGpuInstanceWithPlacement(p.ID, pl)
		if err != nil {
			t.Errorf("create at legal %s: %v", pl, err)
			continue
		}
		if info, err := gi.Info(); err != nil || info.ProfileID != p.ID || info.Placement != pl {
			t.Errorf("Info = %+v, %v; want profile %d at %s", info, err, p.ID, pl)
		}
		ci, err := gi.CreateComputeInstance()
		if err != nil {
			t.Fatalf("CreateComputeInstance at %s: %v", pl, err)
		}
		if info, err := ci.Info(); err != nil || info.ProfileID != wantCI(t, p) || info.ID != 0 {
			t.Errorf("CI Info = %+v, %v; want CI 0 of profile %d", info, err, wantCI(t, p))
		}
		migs, err := d.MigDevices()
		if err != nil || len(migs) != 1 {
			t.Fatalf("MigDevices = %v, %v; want one", migs, err)
		}
		if mem, err := migs[0].MemoryMiB(); err != nil || mem != p.MemoryMiB {
			t.Errorf("MIG device memory = %d, %v; want %d", mem, err, p.MemoryMiB)
		}
		if err := ci.Destroy(); err != nil {
			t.Fatalf("destroy CI: %v", err)
		}
		if err := gi.Destroy(); err != nil {
			t.Fatalf("destroy GI: %v", err)
		}
	}
	for start := -1; start <= m.Slots; start++ {
		for size := 1; size <= m.Slots; size++ {
			pl := api.Placement{Start: start, Size: size}
			if slices.Contains(legal, pl) {
				continue
			}
			_, err := d.CreateGpuInstanceWithPlacement(p.ID, pl)
			if !nvml.IsCode(err, nvml.ErrorInvalidArgument) {
				t.Errorf("create at illegal %s: %v, want ERROR_INVALID_ARGUMENT", pl, err)
			}
		}
	}
}

// checkFill creates the profile at successive non-overlapping legal placements: as many as the
// profile's instance count, the model's instance limit and its compute slices allow succeed,
// and one more is refused for lack of resources.
func checkFill(t *testing.T, m factModel, p factProfile, name string) {
	_, d := simDevice(t, Options{Seed: "facts"}, GPUSpec{Model: name})
	var taken []api.Placement
	free := func() []api.Placement {
		var out []api.Placement
		for _, pl := range p.placements() {
			if !slices.ContainsFunc(taken, pl.Overlaps) {
				out = append(out, pl)
			}
		}
		return out
	}
	limit := min(p.Instances, m.MaxInstances, m.fullSlices(t)/p.slices(t))
	for len(taken) < limit && len(free()) > 0 {
		pl := free()[0]
		if _, err := d.CreateGpuInstanceWithPlacement(p.ID, pl); err != nil {
			t.Fatalf("create #%d at %s: %v", len(taken)+1, pl, err)
		}
		taken = append(taken, pl)
	}
	if len(taken) == 0 {
		t.Fatalf("no instance of %s fits an empty GPU", p.Name)
	}
	next := p.placements()[0] // overlaps when nothing is free
	if f := free(); len(f) > 0 {
		next = f[0]
	}
	if _, err := d.CreateGpuInstanceWithPlacement(p.ID, next); !nvml.IsCode(err, nvml.ErrorInsufficientRes) {
		t.Errorf("create #%d at %s after %v: %v, want ERROR_INSUFFICIENT_RESOURCES", len(taken)+1, next, taken, err)
	}
	gis, err := d.GpuInstances()
	if err != nil || len(gis) != len(taken) {
		t.Errorf("GpuInstances = %d GIs, %v; want %d", len(gis), err, len(taken))
	}
}
