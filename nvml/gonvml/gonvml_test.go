package gonvml

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

const wantNotFound = "libnvidia-ml.so.1 not found: is the NVIDIA driver installed and, in a container, is it started with the NVIDIA runtime?"

func asError(t *testing.T, err error) *nvml.Error {
	t.Helper()
	var e *nvml.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *nvml.Error", err, err)
	}
	return e
}

// This machine has no libnvidia-ml: Init must say so, with the code and the hint.
func TestInitLibraryNotFound(t *testing.T) {
	b := New()
	err := b.Init()
	if err == nil {
		_ = b.Shutdown()
		t.Skip("libnvidia-ml.so.1 is installed here")
	}
	t.Log(err)
	e := asError(t, err)
	if e.Code != nvml.ErrorLibraryNotFound || !nvml.IsCode(err, nvml.ErrorLibraryNotFound) {
		t.Fatalf("code %v, want %v", e.Code, nvml.ErrorLibraryNotFound)
	}
	if !strings.HasPrefix(e.Detail, wantNotFound) {
		t.Fatalf("detail %q, want it to start with %q", e.Detail, wantNotFound)
	}
	if e.Op != "Init(libnvidia-ml.so.1)" {
		t.Fatalf("op %q", e.Op)
	}
}

func TestInitLibraryPathNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	err := New(WithLibraryPath(path)).Init()
	e := asError(t, err)
	if e.Code != nvml.ErrorLibraryNotFound {
		t.Fatalf("code %v", e.Code)
	}
	want := path + " not found: is the NVIDIA driver installed"
	if !strings.HasPrefix(e.Detail, want) || !strings.Contains(e.Detail, "[dlopen: ") {
		t.Fatalf("detail %q", e.Detail)
	}
}

func TestInitDoesNotPanic(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() gonvml.Return { panic("boom") }}
	err := New(withLibrary(lib)).Init()
	if e := asError(t, err); e.Code != nvml.ErrorUnknown || !strings.Contains(e.Detail, "boom") {
		t.Fatalf("got %v", err)
	}
	lib.InitFunc = func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }
	if e := asError(t, New(withLibrary(lib)).Init()); e.Code != nvml.Return(gonvml.ERROR_DRIVER_NOT_LOADED) {
		t.Fatalf("got %v", e)
	}
}

func TestToError(t *testing.T) {
	if err := toError(gonvml.SUCCESS, "X"); err != nil {
		t.Fatalf("SUCCESS gave %v", err)
	}
	err := toError(gonvml.ERROR_IN_USE, "GpuInstanceDestroy(GPU-1 GI 3)")
	e := asError(t, err)
	if e.Code != nvml.ErrorInUse || e.Op != "GpuInstanceDestroy(GPU-1 GI 3)" || e.Detail != "" {
		t.Fatalf("got %+v", e)
	}
	if got, want := err.Error(), "GpuInstanceDestroy(GPU-1 GI 3): NVML_ERROR_IN_USE"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	// Every code we name converts to itself.
	for _, c := range []gonvml.Return{gonvml.ERROR_UNINITIALIZED, gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_NOT_SUPPORTED,
		gonvml.ERROR_NO_PERMISSION, gonvml.ERROR_NOT_FOUND, gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_GPU_IS_LOST,
		gonvml.ERROR_RESET_REQUIRED, gonvml.ERROR_INSUFFICIENT_RESOURCES, gonvml.ERROR_ARGUMENT_VERSION_MISMATCH,
		gonvml.ERROR_INVALID_STATE, gonvml.ERROR_TIMEOUT, gonvml.ERROR_UNKNOWN} {
		if !nvml.IsCode(toError(c, "op"), nvml.Return(c)) || nvml.Return(c).String() != "NVML_"+c.Error() {
			t.Errorf("code %d: %v", c, toError(c, "op"))
		}
	}
	// A code we do not name keeps its number and gets NVML's name as detail.
	e = asError(t, toError(gonvml.ERROR_MEMORY, "op"))
	if e.Code != 20 || e.Detail != "ERROR_MEMORY" {
		t.Fatalf("got %+v", e)
	}
}

func TestComputeInstanceProfileCandidates(t *testing.T) {
	cases := []struct {
		slices, giIndex int
		want            []int
	}{
		{1, gonvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1}},
		{1, gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, []int{gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1}},
		{1, gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, []int{gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
		{2, gonvml.GPU_INSTANCE_PROFILE_2_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}},
		{2, gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, []int{gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}},
		{3, gonvml.GPU_INSTANCE_PROFILE_3_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE}},
		{4, gonvml.GPU_INSTANCE_PROFILE_4_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE}},
		{6, gonvml.GPU_INSTANCE_PROFILE_6_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_6_SLICE}},
		{7, gonvml.GPU_INSTANCE_PROFILE_7_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}},
		{8, gonvml.GPU_INSTANCE_PROFILE_8_SLICE, []int{gonvml.COMPUTE_INSTANCE_PROFILE_8_SLICE}},
		{5, 0, nil},
	}
	for _, c := range cases {
		if got := computeInstanceProfileCandidates(c.slices, c.giIndex); !reflect.DeepEqual(got, c.want) {
			t.Errorf("slices %d, GI index %d: got %v, want %v", c.slices, c.giIndex, got, c.want)
		}
	}
}

func TestFallbackProfileName(t *testing.T) {
	cases := []struct {
		device            string
		id, slices, memMB int
		want              string
	}{
		{"NVIDIA A100-SXM4-40GB", 15, 1, 9856, "1g.10gb"},   // from the table, by id
		{"NVIDIA A100-SXM4-40GB", 20, 1, 4864, "1g.5gb+me"}, // a suffix no synthesis could give
		{"NVIDIA A100-SXM4-40GB", 0, 7, 40192, "7g.40gb"},
		{"NVIDIA A100-SXM4-40GB", 99, 7, 40192, "7g.39gb"}, // unknown id: synthesised
		{"NVIDIA Unknown GPU", 0, 3, 20480, "3g.20gb"},     // unknown model: synthesised
	}
	for _, c := range cases {
		if got := fallbackProfileName(c.device, c.id, c.slices, c.memMB); got != c.want {
			t.Errorf("%s id %d: got %q, want %q", c.device, c.id, got, c.want)
		}
	}
}

// fakeProfile is what one GPU_INSTANCE_PROFILE_* index answers on the fake A100-40GB.
type fakeProfile struct {
	name string
	info gonvml.GpuInstanceProfileInfo
}

// a100Profiles is an A100-40GB as the driver reports it: ids are not indexes, and index 9
// (1_SLICE_REV2) is profile id 15.
var a100Profiles = map[int]fakeProfile{
	0: {"1g.5gb", gonvml.GpuInstanceProfileInfo{Id: 19, SliceCount: 1, InstanceCount: 7, MultiprocessorCount: 14, MemorySizeMB: 4864}},
	1: {"2g.10gb", gonvml.GpuInstanceProfileInfo{Id: 14, SliceCount: 2, InstanceCount: 3, MultiprocessorCount: 28, MemorySizeMB: 9856}},
	2: {"3g.20gb", gonvml.GpuInstanceProfileInfo{Id: 9, SliceCount: 3, InstanceCount: 2, MultiprocessorCount: 42, MemorySizeMB: 19968}},
	3: {"4g.20gb", gonvml.GpuInstanceProfileInfo{Id: 5, SliceCount: 4, InstanceCount: 1, MultiprocessorCount: 56, MemorySizeMB: 19968}},
	4: {"7g.40gb", gonvml.GpuInstanceProfileInfo{Id: 0, SliceCount: 7, InstanceCount: 1, MultiprocessorCount: 98, MemorySizeMB: 40192}},
	7: {"1g.5gb+me", gonvml.GpuInstanceProfileInfo{Id: 20, SliceCount: 1, InstanceCount: 1, MultiprocessorCount: 14, MemorySizeMB: 4864}},
	9: {"1g.10gb", gonvml.GpuInstanceProfileInfo{Id: 15, SliceCount: 1, InstanceCount: 4, MultiprocessorCount: 14, MemorySizeMB: 9856}},
}

// fakeA100 is a mock device answering the V1 profile call from a100Profiles.
func fakeA100() *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) { return "GPU-test", gonvml.SUCCESS },
		GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA A100-SXM4-40GB", gonvml.SUCCESS },
		GetGpuInstanceProfileInfoFunc: func(index int) (gonvml.GpuInstanceProfileInfo, gonvml.Return) {
			if p, ok := a100Profiles[index]; ok {
				return p.info, gonvml.SUCCESS
			}
			return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_NOT_SUPPORTED
		},
	}
}

// namedFromTable answers the versioned call with names, as an R525+ driver does.
func namedFromTable(_ gonvml.Device, index int) (gonvml.GpuInstanceProfileInfo, string, gonvml.Return) {
	if p, ok := a100Profiles[index]; ok {
		return p.info, p.name, gonvml.SUCCESS
	}
	return gonvml.GpuInstanceProfileInfo{}, "", gonvml.ERROR_INVALID_ARGUMENT
}

// namedMismatch is a driver without the versioned struct: everything falls back to V1.
func namedMismatch(gonvml.Device, int) (gonvml.GpuInstanceProfileInfo, string, gonvml.Return) {
	return gonvml.GpuInstanceProfileInfo{}, "", gonvml.ERROR_ARGUMENT_VERSION_MISMATCH
}

func testDevice(t *testing.T, dev *mock.Device, named namedProfileInfoFunc, symbols ...string) nvml.Device {
	t.Helper()
	lib := &mock.Interface{
		InitFunc: func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (gonvml.Device, gonvml.Return) {
			return dev, gonvml.SUCCESS
		},
		ExtensionsFunc: func() gonvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
				for _, have := range symbols {
					if s == have {
						return nil
					}
				}
				return errors.New("undefined symbol " + s)
			}}
		},
	}
	b := New(withLibrary(lib), withNamedProfileInfo(named), withSysfsRoot(t.TempDir()))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	d, err := b.DeviceByIndex(0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The HAMi bug: resolving a profile by slice prefix picks the wrong one. Profiles must be
// found by NVML id and that id's info passed through untouched.
func TestProfilesResolvedByID(t *testing.T) {
	for name, named := range map[string]namedProfileInfoFunc{"named-v3": namedFromTable, "v1-fallback": namedMismatch} {
		t.Run(name, func(t *testing.T) {
			dev := fakeA100()
			var created *gonvml.GpuInstanceProfileInfo
			var createdAt *gonvml.GpuInstancePlacement
			dev.CreateGpuInstanceWithPlacementFunc = func(info *gonvml.GpuInstanceProfileInfo, pl *gonvml.GpuInstancePlacement) (gonvml.GpuInstance, gonvml.Return) {
				created, createdAt = info, pl
				if info.Id == 14 {
					return nil, gonvml.ERROR_INSUFFICIENT_RESOURCES
				}
				return &mock.GpuInstance{}, gonvml.SUCCESS
			}
			var placementsFor uint32 = 999
			dev.GetGpuInstancePossiblePlacementsFunc = func(info *gonvml.GpuInstanceProfileInfo) ([]gonvml.GpuInstancePlacement, gonvml.Return) {
				placementsFor = info.Id
				return []gonvml.GpuInstancePlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}}, gonvml.SUCCESS
			}
			d := testDevice(t, dev, named)

			profiles, err := d.GpuInstanceProfiles()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range profiles {
				got = append(got, p.Name)
			}
			if want := []string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("profile names %v, want %v", got, want)
			}

			p, err := d.GpuInstanceProfileByID(15)
			if err != nil {
				t.Fatal(err)
			}
			if want := (nvml.GpuInstanceProfile{ID: 15, Name: "1g.10gb", SliceCount: 1, InstanceCount: 4, MemoryMiB: 9856, SMs: 14}); p != want {
				t.Fatalf("profile 15 = %+v, want %+v", p, want)
			}
			// Id 9 is the 3g (index 2), not whatever sits at index 9.
			if p, err := d.GpuInstanceProfileByID(9); err != nil || p.Name != "3g.20gb" {
				t.Fatalf("profile 9 = %+v, %v", p, err)
			}
			if _, err := d.GpuInstanceProfileByID(42); !nvml.IsCode(err, nvml.ErrorInvalidArgument) {
				t.Fatalf("profile 42: %v", err)
			}

			pls, err := d.GpuInstancePossiblePlacements(15)
			if err != nil || placementsFor != 15 || len(pls) != 4 || pls[3] != (api.Placement{Start: 6, Size: 2}) {
				t.Fatalf("placements %v, %v (asked for profile %d)", pls, err, placementsFor)
			}

			if _, err := d.CreateGpuInstanceWithPlacement(15, api.Placement{Start: 2, Size: 2}); err != nil {
				t.Fatal(err)
			}
			if *created != a100Profiles[9].info {
				t.Fatalf("created with %+v, want id 15's info %+v", *created, a100Profiles[9].info)
			}
			if *createdAt != (gonvml.GpuInstancePlacement{Start: 2, Size: 2}) {
				t.Fatalf("created at %+v", *createdAt)
			}

			_, err = d.CreateGpuInstanceWithPlacement(14, api.Placement{Start: 2, Size: 2})
			if got, want := err.Error(), "CreateGpuInstanceWithPlacement(GPU-test, profile 14, [2,4)): NVML_ERROR_INSUFFICIENT_RESOURCES"; got != want {
				t.Fatalf("error %q, want %q", got, want)
			}
			if created.Id != 14 {
				t.Fatalf("created with id %d", created.Id)
			}
		})
	}
}

func fakeGI(id, profileID uint32) *mock.GpuInstance {
	return &mock.GpuInstance{GetInfoFunc: func() (gonvml.GpuInstanceInfo, gonvml.Return) {
		return gonvml.GpuInstanceInfo{Id: id, ProfileId: profileID, Placement: gonvml.GpuInstancePlacement{Start: 2, Size: 2}}, gonvml.SUCCESS
	}}
}

func TestCreateComputeInstance(t *testing.T) {
	cases := []struct {
		name       string
		giProfile  uint32
		supported  map[int]uint32 // CI profile index -> CI profile id
		wantTried  []int
		wantCIProf uint32
	}{
		{"1g double memory takes 1_SLICE_REV1", 15, map[int]uint32{0: 0, 7: 7}, []int{7}, 7},
		{"1g takes 1_SLICE", 19, map[int]uint32{0: 0, 7: 7}, []int{0}, 0},
		{"1g without 1_SLICE falls back", 19, map[int]uint32{7: 7}, []int{0, 7}, 7},
		{"3g", 9, map[int]uint32{0: 0, 1: 1, 2: 2}, []int{2}, 2},
		{"7g", 0, map[int]uint32{4: 4}, []int{4}, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gi := fakeGI(3, c.giProfile)
			var tried []int
			gi.GetComputeInstanceProfileInfoFunc = func(index, eng int) (gonvml.ComputeInstanceProfileInfo, gonvml.Return) {
				if eng != gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
					t.Fatalf("engine profile %d", eng)
				}
				tried = append(tried, index)
				if id, ok := c.supported[index]; ok {
					return gonvml.ComputeInstanceProfileInfo{Id: id, InstanceCount: 1}, gonvml.SUCCESS
				}
				return gonvml.ComputeInstanceProfileInfo{}, gonvml.ERROR_NOT_SUPPORTED
			}
			var createdWith uint32 = 999
			gi.CreateComputeInstanceFunc = func(info *gonvml.ComputeInstanceProfileInfo) (gonvml.ComputeInstance, gonvml.Return) {
				createdWith = info.Id
				return &mock.ComputeInstance{GetInfoFunc: func() (gonvml.ComputeInstanceInfo, gonvml.Return) {
					return gonvml.ComputeInstanceInfo{Id: 0, ProfileId: info.Id}, gonvml.SUCCESS
				}}, gonvml.SUCCESS
			}
			dev := fakeA100()
			dev.GetGpuInstanceByIdFunc = func(id int) (gonvml.GpuInstance, gonvml.Return) {
				if id != 3 {
					return nil, gonvml.ERROR_NOT_FOUND
				}
				return gi, gonvml.SUCCESS
			}
			d := testDevice(t, dev, namedFromTable)
			g, err := d.GpuInstanceByID(3)
			if err != nil {
				t.Fatal(err)
			}
			ci, err := g.CreateComputeInstance()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tried, c.wantTried) || createdWith != c.wantCIProf {
				t.Fatalf("tried %v, created with CI profile %d; want %v, %d", tried, createdWith, c.wantTried, c.wantCIProf)
			}
			info, err := ci.Info()
			if err != nil || info != (nvml.ComputeInstanceInfo{ID: 0, ProfileID: int(c.wantCIProf), GpuInstanceID: 3}) {
				t.Fatalf("CI info %+v, %v", info, err)
			}
			if _, err := d.GpuInstanceByID(4); !nvml.IsCode(err, nvml.ErrorNotFound) {
				t.Fatalf("GI 4: %v", err)
			}
		})
	}
}

func TestCreateComputeInstanceNoProfile(t *testing.T) {
	gi := fakeGI(3, 15)
	gi.GetComputeInstanceProfileInfoFunc = func(int, int) (gonvml.ComputeInstanceProfileInfo, gonvml.Return) {
		return gonvml.ComputeInstanceProfileInfo{}, gonvml.ERROR_NOT_SUPPORTED
	}
	dev := fakeA100()
	dev.GetGpuInstanceByIdFunc = func(int) (gonvml.GpuInstance, gonvml.Return) { return gi, gonvml.SUCCESS }
	g, _ := testDevice(t, dev, namedFromTable).GpuInstanceByID(3)
	_, err := g.CreateComputeInstance()
	if !nvml.IsCode(err, nvml.ErrorNotSupported) || !strings.HasPrefix(err.Error(), "CreateComputeInstance(GPU-test GI 3)") {
		t.Fatalf("got %v", err)
	}
}

func TestGpuInstancesSortedByID(t *testing.T) {
	dev := fakeA100()
	byProfile := map[uint32][]uint32{19: {9, 7}, 15: {3}, 9: {1}}
	dev.GetGpuInstancesFunc = func(info *gonvml.GpuInstanceProfileInfo) ([]gonvml.GpuInstance, gonvml.Return) {
		var out []gonvml.GpuInstance
		for _, id := range byProfile[info.Id] {
			out = append(out, fakeGI(id, info.Id))
		}
		return out, gonvml.SUCCESS
	}
	gis, err := testDevice(t, dev, namedFromTable).GpuInstances()
	if err != nil {
		t.Fatal(err)
	}
	var ids, profiles []int
	for _, gi := range gis {
		info, err := gi.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
		profiles = append(profiles, info.ProfileID)
	}
	if !reflect.DeepEqual(ids, []int{1, 3, 7, 9}) || !reflect.DeepEqual(profiles, []int{9, 15, 19, 19}) {
		t.Fatalf("GI ids %v profiles %v", ids, profiles)
	}
}

func TestComputeInstancesListed(t *testing.T) {
	gi := fakeGI(3, 9)
	gi.GetComputeInstanceProfileInfoFunc = func(index, _ int) (gonvml.ComputeInstanceProfileInfo, gonvml.Return) {
		switch index {
		case 0, 1, 2:
			return gonvml.ComputeInstanceProfileInfo{Id: uint32(index), InstanceCount: uint32(3 - index)}, gonvml.SUCCESS
		}
		return gonvml.ComputeInstanceProfileInfo{}, gonvml.ERROR_INVALID_ARGUMENT
	}
	gi.GetComputeInstancesFunc = func(info *gonvml.ComputeInstanceProfileInfo) ([]gonvml.ComputeInstance, gonvml.Return) {
		if info.Id != 0 {
			return nil, gonvml.SUCCESS
		}
		var out []gonvml.ComputeInstance
		for _, id := range []uint32{2, 0} {
			out = append(out, &mock.ComputeInstance{GetInfoFunc: func() (gonvml.ComputeInstanceInfo, gonvml.Return) {
				return gonvml.ComputeInstanceInfo{Id: id}, gonvml.SUCCESS
			}})
		}
		return out, gonvml.SUCCESS
	}
	dev := fakeA100()
	dev.GetGpuInstanceByIdFunc = func(int) (gonvml.GpuInstance, gonvml.Return) { return gi, gonvml.SUCCESS }
	g, _ := testDevice(t, dev, namedFromTable).GpuInstanceByID(3)
	cis, err := g.ComputeInstances()
	if err != nil || len(cis) != 2 {
		t.Fatalf("%d CIs, %v", len(cis), err)
	}
	for i, want := range []int{0, 2} {
		if info, _ := cis[i].Info(); info.ID != want || info.GpuInstanceID != 3 {
			t.Fatalf("CI %d: %+v", i, info)
		}
	}
}

func TestMigDevices(t *testing.T) {
	dev := fakeA100()
	dev.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 4, gonvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 1 || i == 3 {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return &mock.Device{
			GetUUIDFunc:              func() (string, gonvml.Return) { return "MIG-" + string(rune('a'+i)), gonvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, gonvml.Return) { return 7 + i, gonvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, gonvml.Return) { return 0, gonvml.SUCCESS },
			GetMemoryInfoFunc:        func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{Total: 9856 << 20}, gonvml.SUCCESS },
			GetComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
				if i == 0 {
					return []gonvml.ProcessInfo{{Pid: 1234}, {Pid: 42}}, gonvml.SUCCESS
				}
				return nil, gonvml.SUCCESS
			},
		}, gonvml.SUCCESS
	}
	migs, err := testDevice(t, dev, namedFromTable).MigDevices()
	if err != nil || len(migs) != 2 {
		t.Fatalf("%d MIG devices, %v", len(migs), err)
	}
	uuid, _ := migs[1].UUID()
	gi, _ := migs[1].GpuInstanceID()
	mem, _ := migs[0].MemoryMiB()
	pids, _ := migs[0].RunningProcesses()
	if uuid != "MIG-c" || gi != 9 || mem != 9856 || !reflect.DeepEqual(pids, []int{1234, 42}) {
		t.Fatalf("uuid %s gi %d mem %d pids %v", uuid, gi, mem, pids)
	}
}

func TestSetMigMode(t *testing.T) {
	dev := fakeA100()
	var asked int
	answer := [2]gonvml.Return{gonvml.SUCCESS, gonvml.SUCCESS} // activation, ret
	dev.SetMigModeFunc = func(mode int) (gonvml.Return, gonvml.Return) {
		asked = mode
		return answer[0], answer[1]
	}
	d := testDevice(t, dev, namedFromTable)
	if err := d.SetMigMode(true); err != nil || asked != gonvml.DEVICE_MIG_ENABLE {
		t.Fatalf("got %v, mode %d", err, asked)
	}
	answer = [2]gonvml.Return{gonvml.ERROR_IN_USE, gonvml.SUCCESS}
	err := d.SetMigMode(false)
	if !nvml.IsCode(err, nvml.ErrorInUse) || asked != gonvml.DEVICE_MIG_DISABLE || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("pending change: %v", err)
	}
	answer = [2]gonvml.Return{gonvml.ERROR_RESET_REQUIRED, gonvml.ERROR_NO_PERMISSION}
	err = d.SetMigMode(true)
	if !nvml.IsCode(err, nvml.ErrorNoPermission) || !strings.Contains(err.Error(), "activation status NVML_ERROR_RESET_REQUIRED") ||
		!strings.HasPrefix(err.Error(), "SetMigMode(GPU-test, enabled=true)") {
		t.Fatalf("failed change: %v", err)
	}
}

func TestMigModeAndDevice(t *testing.T) {
	dev := fakeA100()
	dev.GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_DISABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	dev.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{Total: 40960 << 20}, gonvml.SUCCESS }
	d := testDevice(t, dev, namedFromTable)
	cur, pend, err := d.MigMode()
	if err != nil || cur || !pend {
		t.Fatalf("mig mode %t %t %v", cur, pend, err)
	}
	if mem, err := d.MemoryMiB(); err != nil || mem != 40960 {
		t.Fatalf("memory %d %v", mem, err)
	}
}

func TestNumaNode(t *testing.T) {
	busID := func(s string) (out [32]int8) {
		for i := range s {
			out[i] = int8(s[i])
		}
		return out
	}
	dev := fakeA100()
	dev.GetNumaNodeIdFunc = func() (int, gonvml.Return) { return 1, gonvml.SUCCESS }
	dev.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
		return gonvml.PciInfo{BusId: busID("00000000:3B:00.0")}, gonvml.SUCCESS
	}
	if n, err := testDevice(t, dev, namedFromTable, "nvmlDeviceGetNumaNodeId").NumaNode(); err != nil || n != 1 {
		t.Fatalf("with GetNumaNodeId: %d %v", n, err)
	}
	// An older driver: no symbol, so sysfs; and no sysfs entry means unknown.
	d := testDevice(t, dev, namedFromTable).(*device)
	if n, err := d.NumaNode(); err != nil || n != -1 {
		t.Fatalf("no sysfs: %d %v", n, err)
	}
	dir := filepath.Join(d.b.sysfsRoot, "bus", "pci", "devices", "0000:3b:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := d.NumaNode(); err != nil || n != 3 {
		t.Fatalf("sysfs: %d %v", n, err)
	}
}

// TestEventsAndResetPending: an event set registers a device for the event mask and turns
// NVML's event data into an nvml.Event (0xFFFFFFFF instance ids: not on a MIG device); the
// reset state comes from row remapping, or page retirement where the GPU has none.
func TestEventsAndResetPending(t *testing.T) {
	dev := fakeA100()
	var registered uint64
	set := &mock.EventSet{
		WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) {
			return gonvml.EventData{Device: dev, EventType: uint64(nvml.EventXidCriticalError), EventData: 79, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}, gonvml.SUCCESS
		},
		FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
	}
	dev.RegisterEventsFunc = func(types uint64, _ gonvml.EventSet) gonvml.Return { registered = types; return gonvml.SUCCESS }
	dev.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED }
	dev.GetRetiredPagesPendingStatusFunc = func() (gonvml.EnableState, gonvml.Return) { return gonvml.FEATURE_ENABLED, gonvml.SUCCESS }
	lib := &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (gonvml.Device, gonvml.Return) { return dev, gonvml.SUCCESS },
		EventSetCreateFunc:         func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS },
	}
	b := New(withLibrary(lib))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	d, err := b.DeviceByIndex(0)
	if err != nil {
		t.Fatal(err)
	}
	es, err := b.NewEventSet()
	if err != nil {
		t.Fatal(err)
	}
	if err := es.Register(d, nvml.EventXidCriticalError|nvml.EventDoubleBitECCError); err != nil || registered != 0xa {
		t.Fatalf("registered %#x, %v", registered, err)
	}
	ev, err := es.Wait(time.Second)
	if want := (nvml.Event{GPUUUID: "GPU-test", Type: nvml.EventXidCriticalError, Data: 79, GPUInstanceID: -1, ComputeInstanceID: -1}); err != nil || ev != want {
		t.Errorf("event %+v, %v; want %+v", ev, err, want)
	}
	if pending, err := d.ResetPending(); err != nil || !pending {
		t.Errorf("ResetPending = %v, %v; want the retired pages' pending state", pending, err)
	}
	if err := es.Free(); err != nil {
		t.Error(err)
	}
}
