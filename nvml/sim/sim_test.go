package sim

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
)

// profileID is the NVML id of a model's profile, by name.
func profileID(t *testing.T, model, name string) int {
	t.Helper()
	m, ok := config.LookupModel(model)
	if !ok {
		t.Fatalf("unknown model %s", model)
	}
	p, ok := m.Profile(name)
	if !ok {
		t.Fatalf("model %s has no profile %s", model, name)
	}
	return p.ID
}

func wantCode(t *testing.T, what string, err error, code nvml.Return) {
	t.Helper()
	if code == nvml.Success {
		if err != nil {
			t.Errorf("%s: %v, want success", what, err)
		}
		return
	}
	if !nvml.IsCode(err, code) {
		t.Errorf("%s: %v, want %s", what, err, code)
	}
}

// create makes a GI of the named profile at start and fails the test otherwise.
func create(t *testing.T, d nvml.Device, model, profile string, start int) nvml.GpuInstance {
	t.Helper()
	id := profileID(t, model, profile)
	m, _ := config.LookupModel(model)
	p, _ := m.ProfileByID(id)
	gi, err := d.CreateGpuInstanceWithPlacement(id, api.Placement{Start: start, Size: p.Placements.Size})
	if err != nil {
		t.Fatalf("create %s@%d: %v", profile, start, err)
	}
	return gi
}

func giID(t *testing.T, gi nvml.GpuInstance) int {
	t.Helper()
	info, err := gi.Info()
	if err != nil {
		t.Fatalf("GI Info: %v", err)
	}
	return info.ID
}

func TestCreateRules(t *testing.T) {
	type at struct {
		profile string
		start   int
	}
	tests := []struct {
		name  string
		model string
		setup []at
		try   at
		size  int // placement size to try; 0: the profile's own
		want  nvml.Return
	}{
		{"empty GPU", "A100-40GB", nil, at{"1g.5gb", 3}, 0, nvml.Success},
		{"overlap 1g in 2g", "A100-40GB", []at{{"2g.10gb", 0}}, at{"1g.5gb", 1}, 0, nvml.ErrorInsufficientRes},
		{"overlap 3g over 2g", "A100-40GB", []at{{"2g.10gb", 2}}, at{"3g.20gb", 0}, 0, nvml.ErrorInsufficientRes},
		{"adjacent is no overlap", "A100-40GB", []at{{"2g.10gb", 0}}, at{"1g.5gb", 2}, 0, nvml.Success},
		{"overlap 1g.10gb on 1g", "A100-40GB", []at{{"1g.5gb", 7 - 1}}, at{"1g.10gb", 6}, 0, nvml.ErrorInsufficientRes},
		{"4g@0 with 3g@4", "A100-40GB", []at{{"4g.20gb", 0}}, at{"3g.20gb", 4}, 0, nvml.Success},
		{"7g on anything", "A100-40GB", []at{{"1g.5gb", 6}}, at{"7g.40gb", 0}, 0, nvml.ErrorInsufficientRes},
		{"+me one per GPU", "A100-40GB", []at{{"1g.5gb+me", 0}}, at{"1g.5gb+me", 1}, 0, nvml.ErrorInsufficientRes},
		{"+me beside plain 1g", "A100-40GB", []at{{"1g.5gb", 0}}, at{"1g.5gb+me", 1}, 0, nvml.Success},
		{"+me across profiles", "A30-24GB", []at{{"1g.6gb+me", 0}}, at{"2g.12gb+me", 2}, 0, nvml.ErrorInsufficientRes},
		{"A30 full on 1g", "A30-24GB", []at{{"1g.6gb", 3}}, at{"4g.24gb", 0}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME blocks plain", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}}, at{"1g.24gb", 3}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME blocks +gfx", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}}, at{"2g.48gb+gfx", 6}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME blocks +me", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}}, at{"1g.24gb+me", 3}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME blocks ALL_ME", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}}, at{"2g.48gb+me.all", 6}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME allows -me", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}}, at{"1g.24gb-me", 3}, 0, nvml.Success},
		{"ALL_ME allows 2g -me", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+me.all", 0}, {"1g.24gb-me", 3}}, at{"2g.48gb-me", 6}, 0, nvml.Success},
		{"ALL_ME refused beside plain", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb", 0}}, at{"1g.24gb+me.all", 3}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME refused beside +gfx", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb+gfx", 9}}, at{"2g.48gb+me.all", 0}, 0, nvml.ErrorInsufficientRes},
		{"ALL_ME beside -me", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb-me", 0}}, at{"1g.24gb+me.all", 3}, 0, nvml.Success},
		{"RTX four 1g", "RTX-PRO-6000-Blackwell-Server", []at{{"1g.24gb", 0}, {"1g.24gb", 3}, {"1g.24gb", 6}}, at{"1g.24gb", 9}, 0, nvml.Success},
		{"illegal start", "A100-40GB", nil, at{"2g.10gb", 1}, 0, nvml.ErrorInvalidArgument},
		{"illegal size", "A100-40GB", nil, at{"3g.20gb", 0}, 3, nvml.ErrorInvalidArgument},
		{"3g has no start 2", "A100-40GB", nil, at{"3g.20gb", 2}, 0, nvml.ErrorInvalidArgument},
		{"illegal placement wins over overlap", "A100-40GB", []at{{"2g.10gb", 0}}, at{"2g.10gb", 1}, 0, nvml.ErrorInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := simDevice(t, Options{}, GPUSpec{Model: tc.model})
			for _, s := range tc.setup {
				create(t, d, tc.model, s.profile, s.start)
			}
			id := profileID(t, tc.model, tc.try.profile)
			m, _ := config.LookupModel(tc.model)
			p, _ := m.ProfileByID(id)
			size := p.Placements.Size
			if tc.size != 0 {
				size = tc.size
			}
			pl := api.Placement{Start: tc.try.start, Size: size}
			gi, err := d.CreateGpuInstanceWithPlacement(id, pl)
			wantCode(t, fmt.Sprintf("create %s at %s", tc.try.profile, pl), err, tc.want)
			if err != nil {
				// Every refusal names the GPU, the profile and the placement.
				uuid, _ := d.UUID()
				var e *nvml.Error
				if !errorAs(err, &e) {
					t.Fatalf("error %v is not an *nvml.Error", err)
				}
				for _, s := range []string{uuid, fmt.Sprint(id), tc.try.profile, pl.String()} {
					if !strings.Contains(e.Op, s) {
						t.Errorf("Op %q does not name %q", e.Op, s)
					}
				}
				if e.Detail == "" {
					t.Errorf("error %v says not why", err)
				}
				return
			}
			if info, err := gi.Info(); err != nil || info.ProfileID != id || info.Placement != pl {
				t.Errorf("Info = %+v, %v", info, err)
			}
		})
	}
}

func errorAs(err error, e **nvml.Error) bool {
	ne, ok := err.(*nvml.Error)
	*e = ne
	return ok
}

func TestUnknownProfile(t *testing.T) {
	_, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB"})
	_, err := d.CreateGpuInstanceWithPlacement(1, api.Placement{Start: 0, Size: 1})
	wantCode(t, "create unknown profile 1", err, nvml.ErrorInvalidArgument)
	_, err = d.GpuInstanceProfileByID(1)
	wantCode(t, "GpuInstanceProfileByID(1)", err, nvml.ErrorInvalidArgument)
	_, err = d.GpuInstancePossiblePlacements(1)
	wantCode(t, "GpuInstancePossiblePlacements(1)", err, nvml.ErrorInvalidArgument)
}

func TestDestroyInUse(t *testing.T) {
	s, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB"})
	gi := create(t, d, "A100-40GB", "3g.20gb", 4)
	ci, err := gi.CreateComputeInstance()
	if err != nil {
		t.Fatal(err)
	}
	_, err = gi.CreateComputeInstance()
	wantCode(t, "second CI", err, nvml.ErrorInsufficientRes)
	wantCode(t, "destroy GI with CI", gi.Destroy(), nvml.ErrorInUse)

	migs, err := d.MigDevices()
	if err != nil || len(migs) != 1 {
		t.Fatalf("MigDevices = %v, %v", migs, err)
	}
	mig := migs[0]
	uuid, _ := mig.UUID()
	if err := s.AddProcess(uuid, 42); err != nil {
		t.Fatal(err)
	}
	if pids, err := mig.RunningProcesses(); err != nil || !reflect.DeepEqual(pids, []int{42}) {
		t.Errorf("RunningProcesses = %v, %v; want [42]", pids, err)
	}
	wantCode(t, "destroy CI with process", ci.Destroy(), nvml.ErrorInUse)
	wantCode(t, "destroy GI with CI and process", gi.Destroy(), nvml.ErrorInUse)
	if err := s.RemoveProcess(uuid, 42); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveProcess(uuid, 42); err == nil {
		t.Errorf("removing a process twice succeeded")
	}
	wantCode(t, "destroy CI", ci.Destroy(), nvml.Success)
	wantCode(t, "destroy GI", gi.Destroy(), nvml.Success)

	// Handles of destroyed objects answer NOT_FOUND.
	_, err = gi.Info()
	wantCode(t, "GI Info after destroy", err, nvml.ErrorNotFound)
	_, err = gi.CreateComputeInstance()
	wantCode(t, "CreateComputeInstance after destroy", err, nvml.ErrorNotFound)
	_, err = gi.ComputeInstances()
	wantCode(t, "ComputeInstances after destroy", err, nvml.ErrorNotFound)
	wantCode(t, "GI Destroy twice", gi.Destroy(), nvml.ErrorNotFound)
	_, err = ci.Info()
	wantCode(t, "CI Info after destroy", err, nvml.ErrorNotFound)
	wantCode(t, "CI Destroy twice", ci.Destroy(), nvml.ErrorNotFound)
	_, err = mig.UUID()
	wantCode(t, "MIG UUID after destroy", err, nvml.ErrorNotFound)
	_, err = mig.RunningProcesses()
	wantCode(t, "RunningProcesses after destroy", err, nvml.ErrorNotFound)
	_, err = d.GpuInstanceByID(giID(t, create(t, d, "A100-40GB", "1g.5gb", 0)) + 1)
	wantCode(t, "GpuInstanceByID of a destroyed id", err, nvml.ErrorNotFound)
	if err := s.AddProcess(uuid, 43); err == nil {
		t.Errorf("AddProcess on a destroyed MIG device succeeded")
	}
}

func TestComputeInstances(t *testing.T) {
	tests := []struct {
		model, profile string
		wantCIProfile  int
	}{
		{"A100-40GB", "1g.5gb", 0},
		{"A100-40GB", "1g.10gb", 7},
		{"A100-40GB", "2g.10gb", 1},
		{"A100-40GB", "3g.20gb", 2},
		{"A100-40GB", "4g.20gb", 3},
		{"A100-40GB", "7g.40gb", 4},
		{"H100-80GB", "1g.20gb", 7},
		{"RTX-PRO-6000-Blackwell-Server", "4g.96gb", 3},
		{"RTX-PRO-6000-Blackwell-Server", "2g.48gb-me", 1},
	}
	for _, tc := range tests {
		t.Run(tc.model+"/"+tc.profile, func(t *testing.T) {
			_, d := simDevice(t, Options{}, GPUSpec{Model: tc.model})
			gi := create(t, d, tc.model, tc.profile, 0)
			ci, err := gi.CreateComputeInstance()
			if err != nil {
				t.Fatal(err)
			}
			info, err := ci.Info()
			want := nvml.ComputeInstanceInfo{ID: 0, ProfileID: tc.wantCIProfile, GpuInstanceID: giID(t, gi)}
			if err != nil || info != want {
				t.Errorf("CI Info = %+v, %v; want %+v", info, err, want)
			}
			cis, err := gi.ComputeInstances()
			if err != nil || len(cis) != 1 {
				t.Fatalf("ComputeInstances = %v, %v", cis, err)
			}
			migs, err := d.MigDevices()
			if err != nil || len(migs) != 1 {
				t.Fatalf("MigDevices = %v, %v", migs, err)
			}
			m, _ := config.LookupModel(tc.model)
			p, _ := m.Profile(tc.profile)
			mem, _ := migs[0].MemoryMiB()
			gid, _ := migs[0].GpuInstanceID()
			cid, _ := migs[0].ComputeInstanceID()
			if mem != p.MemoryMiB || gid != info.GpuInstanceID || cid != 0 {
				t.Errorf("MIG device: memory %d GI %d CI %d; want %d, %d, 0", mem, gid, cid, p.MemoryMiB, info.GpuInstanceID)
			}
		})
	}
}

func TestGpuInstanceIDs(t *testing.T) {
	_, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB"})
	a := create(t, d, "A100-40GB", "1g.5gb", 0)
	b := create(t, d, "A100-40GB", "1g.5gb", 1)
	if giID(t, a) != 1 || giID(t, b) != 2 {
		t.Errorf("first ids = %d, %d; want 1, 2", giID(t, a), giID(t, b))
	}
	old := giID(t, a)
	if err := a.Destroy(); err != nil {
		t.Fatal(err)
	}
	a = create(t, d, "A100-40GB", "1g.5gb", 0)
	if giID(t, a) == old {
		t.Errorf("recreated GI at the same placement got the same id %d", old)
	}
	// Ids go on upwards to the pool's end (14 on 8-slot GPUs), then wrap to the smallest free.
	var seen []int
	for range 14 {
		gi := create(t, d, "A100-40GB", "1g.5gb", 6)
		seen = append(seen, giID(t, gi))
		if err := gi.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	want := []int{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1, 4, 5} // 2 and 3 are in use
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("ids = %v, want %v", seen, want)
	}
	gis, err := d.GpuInstances()
	if err != nil || len(gis) != 2 || giID(t, gis[0]) != 2 || giID(t, gis[1]) != 3 {
		t.Errorf("GpuInstances = %v, %v; want GIs 2 and 3 in id order", gis, err)
	}
	byID, err := d.GpuInstanceByID(3)
	if err != nil || giID(t, byID) != 3 {
		t.Errorf("GpuInstanceByID(3) = %v, %v", byID, err)
	}
}

func TestMigModeOff(t *testing.T) {
	notSupported := func(t *testing.T, d nvml.Device) {
		t.Helper()
		pl := api.Placement{Start: 0, Size: 1}
		calls := map[string]func() error{
			"GpuInstanceProfiles":            func() error { _, err := d.GpuInstanceProfiles(); return err },
			"GpuInstanceProfileByID":         func() error { _, err := d.GpuInstanceProfileByID(19); return err },
			"GpuInstancePossiblePlacements":  func() error { _, err := d.GpuInstancePossiblePlacements(19); return err },
			"CreateGpuInstanceWithPlacement": func() error { _, err := d.CreateGpuInstanceWithPlacement(19, pl); return err },
			"GpuInstances":                   func() error { _, err := d.GpuInstances(); return err },
			"GpuInstanceByID":                func() error { _, err := d.GpuInstanceByID(1); return err },
		}
		for name, call := range calls {
			err := call()
			wantCode(t, name, err, nvml.ErrorNotSupported)
			if err != nil && !strings.Contains(err.Error(), "MIG mode is disabled") {
				t.Errorf("%s: %v does not say MIG mode is disabled", name, err)
			}
		}
		if migs, err := d.MigDevices(); err != nil || len(migs) != 0 {
			t.Errorf("MigDevices = %v, %v; want none", migs, err)
		}
	}

	t.Run("immediate", func(t *testing.T) {
		_, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB", MigDisabled: true})
		notSupported(t, d)
		if cur, pend, _ := d.MigMode(); cur || pend {
			t.Errorf("MigMode = %v, %v; want off, off", cur, pend)
		}
		wantCode(t, "SetMigMode(true)", d.SetMigMode(true), nvml.Success)
		if cur, pend, _ := d.MigMode(); !cur || !pend {
			t.Errorf("MigMode = %v, %v; want on, on", cur, pend)
		}
		gi := create(t, d, "A100-40GB", "1g.5gb", 0)
		wantCode(t, "SetMigMode(false) with a GI", d.SetMigMode(false), nvml.ErrorInUse)
		if err := gi.Destroy(); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "SetMigMode(false)", d.SetMigMode(false), nvml.Success)
		notSupported(t, d)
	})

	t.Run("needs reset", func(t *testing.T) {
		s, d := simDevice(t, Options{MigModeNeedsReset: true}, GPUSpec{Model: "A100-40GB", MigDisabled: true})
		wantCode(t, "SetMigMode(true)", d.SetMigMode(true), nvml.Success)
		if cur, pend, _ := d.MigMode(); cur || !pend {
			t.Errorf("MigMode = %v, %v; want off, pending on", cur, pend)
		}
		notSupported(t, d)
		if err := s.ResetGPU(0); err != nil {
			t.Fatal(err)
		}
		if cur, pend, _ := d.MigMode(); !cur || !pend {
			t.Errorf("after reset MigMode = %v, %v; want on, on", cur, pend)
		}
		gi := create(t, d, "A100-40GB", "1g.5gb", 0)
		ci, err := gi.CreateComputeInstance()
		if err != nil {
			t.Fatal(err)
		}
		migs, _ := d.MigDevices()
		uuid, _ := migs[0].UUID()
		if err := s.AddProcess(uuid, 7); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "ResetGPU with a process", s.ResetGPU(0), nvml.ErrorInUse)
		if err := s.RemoveProcess(uuid, 7); err != nil {
			t.Fatal(err)
		}
		// A reset drops every instance, as on the hardware.
		if err := s.ResetGPU(0); err != nil {
			t.Fatal(err)
		}
		_, err = ci.Info()
		wantCode(t, "CI after reset", err, nvml.ErrorNotFound)
		_, err = gi.Info()
		wantCode(t, "GI after reset", err, nvml.ErrorNotFound)
		wantCode(t, "SetMigMode(false)", d.SetMigMode(false), nvml.Success)
		if cur, pend, _ := d.MigMode(); !cur || pend {
			t.Errorf("MigMode = %v, %v; want on, pending off", cur, pend)
		}
		if snap := s.Snapshot(); !snap[0].MigEnabled || snap[0].MigPending {
			t.Errorf("Snapshot MIG = %v, pending %v", snap[0].MigEnabled, snap[0].MigPending)
		}
	})
}

func TestUninitialized(t *testing.T) {
	s, err := New(Options{}, GPUSpec{Model: "A100-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]func() error{
		"Shutdown":      s.Shutdown,
		"DriverVersion": func() error { _, err := s.DriverVersion(); return err },
		"DeviceCount":   func() error { _, err := s.DeviceCount(); return err },
		"DeviceByIndex": func() error { _, err := s.DeviceByIndex(0); return err },
	}
	for name, call := range before {
		wantCode(t, name+" before Init", call(), nvml.ErrorUninitialized)
	}

	// Handles taken in a session stop working when it ends.
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	d, _ := s.DeviceByIndex(0)
	gi := create(t, d, "A100-40GB", "1g.5gb", 0)
	ci, err := gi.CreateComputeInstance()
	if err != nil {
		t.Fatal(err)
	}
	migs, _ := d.MigDevices()
	mig := migs[0]
	if v, err := s.DriverVersion(); err != nil || v == "" {
		t.Errorf("DriverVersion = %q, %v", v, err)
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	pl := api.Placement{Start: 1, Size: 1}
	after := map[string]func() error{
		"UUID":                           func() error { _, err := d.UUID(); return err },
		"Name":                           func() error { _, err := d.Name(); return err },
		"MemoryMiB":                      func() error { _, err := d.MemoryMiB(); return err },
		"NumaNode":                       func() error { _, err := d.NumaNode(); return err },
		"MigMode":                        func() error { _, _, err := d.MigMode(); return err },
		"SetMigMode":                     func() error { return d.SetMigMode(true) },
		"GpuInstanceProfiles":            func() error { _, err := d.GpuInstanceProfiles(); return err },
		"GpuInstanceProfileByID":         func() error { _, err := d.GpuInstanceProfileByID(19); return err },
		"GpuInstancePossiblePlacements":  func() error { _, err := d.GpuInstancePossiblePlacements(19); return err },
		"CreateGpuInstanceWithPlacement": func() error { _, err := d.CreateGpuInstanceWithPlacement(19, pl); return err },
		"GpuInstances":                   func() error { _, err := d.GpuInstances(); return err },
		"GpuInstanceByID":                func() error { _, err := d.GpuInstanceByID(1); return err },
		"MigDevices":                     func() error { _, err := d.MigDevices(); return err },
		"GI.Info":                        func() error { _, err := gi.Info(); return err },
		"GI.CreateComputeInstance":       func() error { _, err := gi.CreateComputeInstance(); return err },
		"GI.ComputeInstances":            func() error { _, err := gi.ComputeInstances(); return err },
		"GI.Destroy":                     gi.Destroy,
		"CI.Info":                        func() error { _, err := ci.Info(); return err },
		"CI.Destroy":                     ci.Destroy,
		"MIG.UUID":                       func() error { _, err := mig.UUID(); return err },
		"MIG.GpuInstanceID":              func() error { _, err := mig.GpuInstanceID(); return err },
		"MIG.ComputeInstanceID":          func() error { _, err := mig.ComputeInstanceID(); return err },
		"MIG.MemoryMiB":                  func() error { _, err := mig.MemoryMiB(); return err },
		"MIG.RunningProcesses":           func() error { _, err := mig.RunningProcesses(); return err },
	}
	for name, call := range after {
		wantCode(t, name+" after Shutdown", call(), nvml.ErrorUninitialized)
	}
	if d.Index() != 0 {
		t.Errorf("Index = %d", d.Index())
	}
	// Nothing changed while uninitialised.
	if snap := s.Snapshot(); len(snap[0].GpuInstances) != 1 || len(snap[0].GpuInstances[0].ComputeInstances) != 1 {
		t.Errorf("state changed while uninitialised: %+v", snap)
	}

	// Init nests as in NVML: two Inits need two Shutdowns.
	_ = s.Init()
	_ = s.Init()
	_ = s.Shutdown()
	if _, err := s.DeviceCount(); err != nil {
		t.Errorf("DeviceCount after 2 Init, 1 Shutdown: %v", err)
	}
}

func TestFailInit(t *testing.T) {
	s, err := New(Options{}, GPUSpec{Model: "H100-80GB"})
	if err != nil {
		t.Fatal(err)
	}
	s.FailInit(nvml.ErrorLibraryNotFound)
	for range 2 { // it persists
		err := s.Init()
		wantCode(t, "Init", err, nvml.ErrorLibraryNotFound)
		if err != nil && !strings.Contains(err.Error(), "libnvidia-ml") {
			t.Errorf("Init error %v does not name the library", err)
		}
	}
	_, err = s.DeviceCount()
	wantCode(t, "DeviceCount after failed Init", err, nvml.ErrorUninitialized)
	s.FailInit(nvml.Success)
	wantCode(t, "Init after clearing", s.Init(), nvml.Success)
	if n, err := s.DeviceCount(); err != nil || n != 1 {
		t.Errorf("DeviceCount = %d, %v", n, err)
	}
}

func TestFailNext(t *testing.T) {
	const model = "A100-40GB"
	type env struct {
		s  *Sim
		d  nvml.Device
		gi nvml.GpuInstance
		ci nvml.ComputeInstance
	}
	tests := []struct {
		op    Op
		setup func(t *testing.T, e *env) // leaves e ready for call
		call  func(e *env) error
		// check verifies the failed call changed nothing.
		check func(t *testing.T, e *env)
	}{
		{
			op:    OpCreateGpuInstance,
			setup: func(t *testing.T, e *env) {},
			call: func(e *env) error {
				_, err := e.d.CreateGpuInstanceWithPlacement(profileID(t, model, "1g.5gb"), api.Placement{Start: 0, Size: 1})
				return err
			},
			check: func(t *testing.T, e *env) {
				if gis, _ := e.d.GpuInstances(); len(gis) != 0 {
					t.Errorf("%d GIs after a failed create", len(gis))
				}
			},
		},
		{
			op:    OpCreateComputeInstance,
			setup: func(t *testing.T, e *env) { e.gi = create(t, e.d, model, "1g.5gb", 0) },
			call:  func(e *env) error { _, err := e.gi.CreateComputeInstance(); return err },
			check: func(t *testing.T, e *env) {
				if cis, _ := e.gi.ComputeInstances(); len(cis) != 0 {
					t.Errorf("%d CIs after a failed create", len(cis))
				}
			},
		},
		{
			op:    OpDestroyGpuInstance,
			setup: func(t *testing.T, e *env) { e.gi = create(t, e.d, model, "1g.5gb", 0) },
			call:  func(e *env) error { return e.gi.Destroy() },
			check: func(t *testing.T, e *env) {
				if _, err := e.gi.Info(); err != nil {
					t.Errorf("GI gone after a failed destroy: %v", err)
				}
			},
		},
		{
			op: OpDestroyComputeInstance,
			setup: func(t *testing.T, e *env) {
				e.gi = create(t, e.d, model, "1g.5gb", 0)
				var err error
				if e.ci, err = e.gi.CreateComputeInstance(); err != nil {
					t.Fatal(err)
				}
			},
			call: func(e *env) error { return e.ci.Destroy() },
			check: func(t *testing.T, e *env) {
				if _, err := e.ci.Info(); err != nil {
					t.Errorf("CI gone after a failed destroy: %v", err)
				}
			},
		},
		{
			op:    OpSetMigMode,
			setup: func(t *testing.T, e *env) {},
			call:  func(e *env) error { return e.d.SetMigMode(false) },
			check: func(t *testing.T, e *env) {
				if cur, pend, _ := e.d.MigMode(); !cur || !pend {
					t.Errorf("MIG mode changed by a failed SetMigMode: %v, %v", cur, pend)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.op.String(), func(t *testing.T) {
			s, err := New(Options{}, GPUSpec{Model: model}, GPUSpec{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Init(); err != nil {
				t.Fatal(err)
			}
			d, _ := s.DeviceByIndex(0)
			e := &env{s: s, d: d}
			tc.setup(t, e)
			s.FailNext(1, tc.op, nvml.ErrorUnknown) // another GPU: no effect here
			s.FailNext(0, tc.op, nvml.ErrorNoPermission)
			s.FailNext(0, tc.op, nvml.ErrorInvalidState) // replaces the one before
			err = tc.call(e)
			wantCode(t, "first call", err, nvml.ErrorInvalidState)
			if err != nil && !strings.Contains(err.Error(), "injected") {
				t.Errorf("injected fault %v does not say so", err)
			}
			tc.check(t, e)
			wantCode(t, "second call", tc.call(e), nvml.Success)
		})
	}

	t.Run("withdrawn", func(t *testing.T) {
		s, d := simDevice(t, Options{}, GPUSpec{Model: model})
		s.FailNext(0, OpSetMigMode, nvml.ErrorInvalidState)
		s.FailNext(0, OpSetMigMode, nvml.Success)
		wantCode(t, "SetMigMode after withdrawing the fault", d.SetMigMode(true), nvml.Success)
	})
}

func TestLoseGpuInstance(t *testing.T) {
	s, d := simDevice(t, Options{}, GPUSpec{Model: "H100-80GB"})
	gi := create(t, d, "H100-80GB", "3g.40gb", 0)
	keep := create(t, d, "H100-80GB", "3g.40gb", 4)
	ci, err := gi.CreateComputeInstance()
	if err != nil {
		t.Fatal(err)
	}
	migs, _ := d.MigDevices()
	uuid, _ := migs[0].UUID()
	if err := s.AddProcess(uuid, 100); err != nil {
		t.Fatal(err)
	}
	if err := s.LoseGpuInstance(0, giID(t, gi)); err != nil {
		t.Fatal(err)
	}
	_, err = gi.Info()
	wantCode(t, "lost GI Info", err, nvml.ErrorNotFound)
	wantCode(t, "lost GI Destroy", gi.Destroy(), nvml.ErrorNotFound)
	_, err = ci.Info()
	wantCode(t, "lost CI Info", err, nvml.ErrorNotFound)
	_, err = migs[0].RunningProcesses()
	wantCode(t, "lost MIG device", err, nvml.ErrorNotFound)
	_, err = d.GpuInstanceByID(giID(t, keep) - 1)
	wantCode(t, "GpuInstanceByID of the lost GI", err, nvml.ErrorNotFound)
	gis, err := d.GpuInstances()
	if err != nil || len(gis) != 1 || giID(t, gis[0]) != giID(t, keep) {
		t.Errorf("GpuInstances = %v, %v; want only GI %d", gis, err, giID(t, keep))
	}
	if migs, _ := d.MigDevices(); len(migs) != 0 {
		t.Errorf("%d MIG devices left", len(migs))
	}
	// Its placement is free again.
	create(t, d, "H100-80GB", "3g.40gb", 0)
	if err := s.LoseGpuInstance(0, 99); err == nil {
		t.Errorf("losing an unknown GI succeeded")
	}
	if err := s.LoseGpuInstance(1, 1); err == nil {
		t.Errorf("losing a GI of an unknown GPU succeeded")
	}
}

var (
	gpuUUIDRE = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	migUUIDRE = regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

func TestDeterministicUUIDs(t *testing.T) {
	twoG := map[string]string{"A100-40GB": "2g.10gb", "H100-80GB": "2g.20gb"}
	run := func(seed string) (snap []GPUState, migUUIDs []string) {
		s, err := New(Options{Seed: seed}, GPUSpec{Model: "A100-40GB"}, GPUSpec{Model: "H100-80GB"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Init(); err != nil {
			t.Fatal(err)
		}
		for i, model := range []string{"A100-40GB", "H100-80GB"} {
			d, _ := s.DeviceByIndex(i)
			for round := range 2 { // destroy and recreate: a fresh MIG UUID each time
				gi := create(t, d, model, twoG[model], 0)
				ci, err := gi.CreateComputeInstance()
				if err != nil {
					t.Fatal(err)
				}
				migs, _ := d.MigDevices()
				u, _ := migs[0].UUID()
				migUUIDs = append(migUUIDs, u)
				if round == 0 {
					_ = ci.Destroy()
					_ = gi.Destroy()
				}
			}
		}
		return s.Snapshot(), migUUIDs
	}
	a, migA := run("node-a")
	a2, migA2 := run("node-a")
	b, migB := run("node-b")
	if !reflect.DeepEqual(a, a2) || !reflect.DeepEqual(migA, migA2) {
		t.Errorf("equal seeds differ:\n%+v\n%+v", a, a2)
	}
	if a[0].UUID == b[0].UUID || migA[0] == migB[0] {
		t.Errorf("seeds node-a and node-b give equal UUIDs %s, %s", a[0].UUID, migA[0])
	}
	if a[0].UUID == a[1].UUID {
		t.Errorf("GPUs 0 and 1 share UUID %s", a[0].UUID)
	}
	seen := map[string]bool{}
	for _, u := range migA {
		if !migUUIDRE.MatchString(u) {
			t.Errorf("MIG UUID %q malformed", u)
		}
		if seen[u] {
			t.Errorf("MIG UUID %s handed out twice", u)
		}
		seen[u] = true
	}
	for _, g := range a {
		if !gpuUUIDRE.MatchString(g.UUID) {
			t.Errorf("GPU UUID %q malformed", g.UUID)
		}
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		spec     GPUSpec
		wantName string
		wantKey  string
	}{
		{GPUSpec{Model: "A100-40GB"}, "NVIDIA A100-SXM4-40GB", "A100-40GB"},
		{GPUSpec{Model: "NVIDIA A100-PCIE-40GB"}, "NVIDIA A100-PCIE-40GB", "A100-40GB"},
		{GPUSpec{Model: "nvidia a100-pcie-40gb"}, "NVIDIA A100-PCIE-40GB", "A100-40GB"},
		{GPUSpec{Model: "A100-PCIE-40GB"}, "NVIDIA A100-PCIE-40GB", "A100-40GB"},
		{GPUSpec{Model: "H200-SXM5"}, "NVIDIA H200", "H200-141GB"},
		{GPUSpec{Model: "NVIDIA H200 NVL"}, "NVIDIA H200 NVL", "H200-141GB"},
		{GPUSpec{Model: "H100-80GB", NVMLName: "NVIDIA H100 PCIe", UUID: "GPU-given"}, "NVIDIA H100 PCIe", "H100-80GB"},
	}
	for _, tc := range tests {
		t.Run(tc.spec.Model, func(t *testing.T) {
			s, err := New(Options{Seed: "n"}, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			g := s.Snapshot()[0]
			if g.Name != tc.wantName || g.Model != tc.wantKey || !g.MigEnabled {
				t.Errorf("got %s (%s, MIG %v); want %s (%s, MIG on)", g.Name, g.Model, g.MigEnabled, tc.wantName, tc.wantKey)
			}
			if tc.spec.UUID != "" && g.UUID != tc.spec.UUID {
				t.Errorf("UUID = %s, want %s", g.UUID, tc.spec.UUID)
			}
		})
	}
	if _, err := New(Options{}, GPUSpec{Model: "A100-40GB"}, GPUSpec{Model: "V100"}); err == nil ||
		!strings.Contains(err.Error(), "V100") || !strings.Contains(err.Error(), "A100-40GB") {
		t.Errorf("unknown model: %v; want an error naming it and listing known models", err)
	}
	if _, err := New(Options{}, GPUSpec{Model: "A30", UUID: "GPU-x"}, GPUSpec{Model: "A30", UUID: "GPU-x"}); err == nil {
		t.Errorf("duplicate UUIDs accepted")
	}
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Init()
	if n, err := s.DeviceCount(); n != 0 || err != nil {
		t.Errorf("no GPUs: DeviceCount = %d, %v", n, err)
	}
	_, err = s.DeviceByIndex(0)
	wantCode(t, "DeviceByIndex out of range", err, nvml.ErrorInvalidArgument)
}

func TestSnapshot(t *testing.T) {
	s, err := New(Options{Seed: "snap"}, GPUSpec{Model: "A30-24GB"}, GPUSpec{Model: "A100-40GB", MigDisabled: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Init()
	d, _ := s.DeviceByIndex(0)
	b := create(t, d, "A30-24GB", "2g.12gb", 2) // GI 1
	a := create(t, d, "A30-24GB", "1g.6gb", 0)  // GI 2
	if _, err := a.CreateComputeInstance(); err != nil {
		t.Fatal(err)
	}
	migs, _ := d.MigDevices()
	mu, _ := migs[0].UUID()
	_ = s.AddProcess(mu, 30)
	_ = s.AddProcess(mu, 10)
	_ = b
	got := s.Snapshot()
	want := []GPUState{
		{Index: 0, UUID: got[0].UUID, Name: "NVIDIA A30", Model: "A30-24GB", MigEnabled: true, MigPending: true,
			GpuInstances: []GpuInstanceState{
				{ID: 1, ProfileID: 5, ProfileName: "2g.12gb", Placement: api.Placement{Start: 2, Size: 2}},
				{ID: 2, ProfileID: 14, ProfileName: "1g.6gb", Placement: api.Placement{Start: 0, Size: 1},
					ComputeInstances: []ComputeInstanceState{{ID: 0, MigUUID: mu, Processes: []int{10, 30}}}},
			}},
		{Index: 1, UUID: got[1].UUID, Name: "NVIDIA A100-SXM4-40GB", Model: "A100-40GB"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Snapshot:\n got %+v\nwant %+v", got, want)
	}
}

// TestConcurrentCreate races eight goroutines to create 1g GIs at every placement of one
// A100-40GB: the seven placements are taken exactly once.
func TestConcurrentCreate(t *testing.T) {
	s, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB"})
	id := profileID(t, "A100-40GB", "1g.5gb")
	placements, err := d.GpuInstancePossiblePlacements(id)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		won     []api.Placement
		wg      sync.WaitGroup
		start   = make(chan struct{})
		badErrs []error
	)
	for range 8 {
		wg.Go(func() {
			<-start
			for _, pl := range placements {
				_, err := d.CreateGpuInstanceWithPlacement(id, pl)
				mu.Lock()
				switch {
				case err == nil:
					won = append(won, pl)
				case !nvml.IsCode(err, nvml.ErrorInsufficientRes):
					badErrs = append(badErrs, err)
				}
				mu.Unlock()
				_, _ = d.GpuInstances() // readers race too
				_ = s.Snapshot()
			}
		})
	}
	close(start)
	wg.Wait()
	if len(badErrs) > 0 {
		t.Errorf("unexpected errors: %v", badErrs)
	}
	if len(won) != 7 {
		t.Errorf("%d creates succeeded, want 7: %v", len(won), won)
	}
	for i := range won {
		for j := range i {
			if won[i].Overlaps(won[j]) {
				t.Errorf("created GIs overlap: %s and %s", won[i], won[j])
			}
		}
	}
	if gis, _ := d.GpuInstances(); len(gis) != 7 {
		t.Errorf("%d GIs exist, want 7", len(gis))
	}
}

// TestLimitRules checks the instance-count, instance-limit and compute-slice rules, which the
// real tables never reach before a placement overlaps; each case tightens one limit of a copy
// of the A100-40GB so that it binds first.
func TestLimitRules(t *testing.T) {
	tests := []struct {
		name   string
		tweak  func(m *config.Model)
		starts []int // 1g.5gb creates; all but the last succeed
		detail string
	}{
		{"profile instance count", func(m *config.Model) { mustProfile(t, m, "1g.5gb").Instances = 2 }, []int{0, 1, 2}, "allows 2 instances"},
		{"model instance limit", func(m *config.Model) { m.MaxInstances = 3 }, []int{0, 1, 2, 3}, "allows 3 GPU instances"},
		{"compute slices", func(m *config.Model) { mustProfile(t, m, "7g.40gb").Name = "4g.40gb" }, []int{0, 1, 2, 3, 4}, "compute slices"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, d := simDevice(t, Options{}, GPUSpec{Model: "A100-40GB"})
			m := *s.gpus[0].model
			m.Profiles = append([]config.Profile(nil), m.Profiles...)
			tc.tweak(&m)
			s.gpus[0].model = &m
			id := mustProfile(t, &m, "1g.5gb").ID
			for i, start := range tc.starts {
				_, err := d.CreateGpuInstanceWithPlacement(id, api.Placement{Start: start, Size: 1})
				if i < len(tc.starts)-1 {
					wantCode(t, fmt.Sprintf("create #%d", i+1), err, nvml.Success)
					continue
				}
				wantCode(t, "one too many", err, nvml.ErrorInsufficientRes)
				if err != nil && !strings.Contains(err.Error(), tc.detail) {
					t.Errorf("%v does not say %q", err, tc.detail)
				}
			}
		})
	}
}

func mustProfile(t *testing.T, m *config.Model, name string) *config.Profile {
	t.Helper()
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return &m.Profiles[i]
		}
	}
	t.Fatalf("no profile %s", name)
	return nil
}

// TestCreateLatency: with Options.CreateLatency, creates on one GPU take their turns, creates
// on two GPUs overlap, and FirstCreate says when the first was asked for.
func TestCreateLatency(t *testing.T) {
	const latency = 150 * time.Millisecond
	s, err := New(Options{Seed: "n", CreateLatency: latency}, GPUSpec{Model: "A100-40GB"}, GPUSpec{Model: "A100-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	if !s.FirstCreate().IsZero() {
		t.Fatal("FirstCreate before any create")
	}
	devices := make([]nvml.Device, 2)
	for i := range devices {
		if devices[i], err = s.DeviceByIndex(i); err != nil {
			t.Fatal(err)
		}
	}
	concurrently := func(starts ...[2]int) time.Duration { // {GPU, 1g start}
		began := time.Now()
		var wg sync.WaitGroup
		for _, gs := range starts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				create(t, devices[gs[0]], "A100-40GB", "1g.5gb", gs[1])
			}()
		}
		wg.Wait()
		return time.Since(began)
	}
	began := time.Now()
	if took := concurrently([2]int{0, 0}, [2]int{0, 1}); took < 2*latency {
		t.Errorf("two creates on one GPU took %v, want at least %v", took, 2*latency)
	}
	if first := s.FirstCreate(); first.Before(began) || first.After(began.Add(latency)) {
		t.Errorf("FirstCreate %v, the creates began at %v", first, began)
	}
	if took := concurrently([2]int{0, 2}, [2]int{1, 2}); took >= 2*latency {
		t.Errorf("creates on two GPUs took %v, want them to overlap (under %v)", took, 2*latency)
	}
}

// TestHoldAndAfter: HoldNext stops the next call of an op before it changes anything, until
// it is released (the call goes on) or abandoned (its goroutine ends there, running only its
// deferred calls); AfterNext runs once, after a call that succeeded, and not after one that
// failed.
func TestHoldAndAfter(t *testing.T) {
	const model = "A100-40GB"
	s, d := simDevice(t, Options{}, GPUSpec{Model: model})
	gis := func() int { l, _ := d.GpuInstances(); return len(l) }
	createGI := func(start int) (nvml.GpuInstance, error) {
		return d.CreateGpuInstanceWithPlacement(profileID(t, model, "1g.5gb"), api.Placement{Start: start, Size: 1})
	}

	h := s.HoldNext(0, OpCreateGpuInstance)
	returned := make(chan error, 1)
	go func() { _, err := createGI(0); returned <- err }()
	<-h.Reached()
	if n := gis(); n != 0 {
		t.Errorf("a held create made %d GIs before its release", n)
	}
	h.Release()
	if err := <-returned; err != nil {
		t.Fatalf("released create: %v", err)
	}

	h = s.HoldNext(0, OpCreateGpuInstance)
	deferred := make(chan struct{})
	go func() {
		defer close(deferred)
		_, err := createGI(1)
		returned <- err
	}()
	<-h.Reached()
	h.Abandon()
	<-deferred
	select {
	case err := <-returned:
		t.Fatalf("an abandoned call returned (%v)", err)
	default:
	}
	if n := gis(); n != 1 {
		t.Errorf("%d GIs after an abandoned create, want the 1 made before", n)
	}

	ran := 0
	s.AfterNext(0, OpCreateGpuInstance, func() {
		ran++
		if n := gis(); n != 2 {
			t.Errorf("AfterNext ran with %d GIs: before the create took effect", n)
		}
	})
	s.FailNext(0, OpCreateGpuInstance, nvml.ErrorUnknown)
	if _, err := createGI(1); err == nil {
		t.Fatal("the injected fault did not fail the create")
	}
	if ran != 0 {
		t.Error("AfterNext ran after a failed call")
	}
	if _, err := createGI(1); err != nil {
		t.Fatal(err)
	}
	if _, err := createGI(2); err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Errorf("AfterNext ran %d times, want once", ran)
	}
}

// TestLoseGPU: a GPU fallen off the bus answers every call but UUID with GPU_IS_LOST, its
// GPU and compute instances' calls included, and answers again as before once recovered.
func TestLoseGPU(t *testing.T) {
	const model = "A100-40GB"
	s, d := simDevice(t, Options{}, GPUSpec{Model: model})
	gi := create(t, d, model, "2g.10gb", 0)
	ci, err := gi.CreateComputeInstance()
	if err != nil {
		t.Fatal(err)
	}
	id, giid := profileID(t, model, "1g.5gb"), giID(t, gi)
	s.LoseGPU(0)
	if _, err := d.UUID(); err != nil {
		t.Errorf("UUID of a lost GPU: %v", err)
	}
	calls := map[string]func() error{
		"Name":                          func() error { _, err := d.Name(); return err },
		"MemoryMiB":                     func() error { _, err := d.MemoryMiB(); return err },
		"MigMode":                       func() error { _, _, err := d.MigMode(); return err },
		"SetMigMode":                    func() error { return d.SetMigMode(true) },
		"GpuInstanceProfiles":           func() error { _, err := d.GpuInstanceProfiles(); return err },
		"GpuInstanceProfileByID":        func() error { _, err := d.GpuInstanceProfileByID(id); return err },
		"GpuInstancePossiblePlacements": func() error { _, err := d.GpuInstancePossiblePlacements(id); return err },
		"CreateGpuInstanceWithPlacement": func() error {
			_, err := d.CreateGpuInstanceWithPlacement(id, api.Placement{Start: 4, Size: 1})
			return err
		},
		"GpuInstances":             func() error { _, err := d.GpuInstances(); return err },
		"GpuInstanceByID":          func() error { _, err := d.GpuInstanceByID(giid); return err },
		"MigDevices":               func() error { _, err := d.MigDevices(); return err },
		"GI Info":                  func() error { _, err := gi.Info(); return err },
		"GI ComputeInstances":      func() error { _, err := gi.ComputeInstances(); return err },
		"GI CreateComputeInstance": func() error { _, err := gi.CreateComputeInstance(); return err },
		"GI Destroy":               func() error { return gi.Destroy() },
		"CI Info":                  func() error { _, err := ci.Info(); return err },
		"CI Destroy":               func() error { return ci.Destroy() },
	}
	for name, call := range calls {
		wantCode(t, name+" of a lost GPU", call(), nvml.ErrorGPUIsLost)
	}
	s.RecoverGPU(0)
	if _, err := d.GpuInstancePossiblePlacements(id); err != nil {
		t.Errorf("a recovered GPU: %v", err)
	}
	if gis, err := d.GpuInstances(); err != nil || len(gis) != 1 {
		t.Errorf("a recovered GPU keeps its instances: %v %v", gis, err)
	}
}
