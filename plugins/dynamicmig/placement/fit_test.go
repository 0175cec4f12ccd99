package placement

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/test/fixture"
)

var defaultOpts = Options{MIGPolicy: api.PolicyBinpack, HAMiCorePolicy: api.PolicySpread, FragmentationAware: true}

// inventoryOf publishes simulated GPUs through the device plugin's own inventory code.
// allow, if given, is the allowlist of every model ("PROFILE,PROFILE"); mode "" is mig.
func inventoryOf(t testing.TB, mode, allow string, models ...string) []GPU {
	t.Helper()
	doc := "nodeconfig:\n- name: n\n  operatingmode: " + cmpOr(mode, api.ModeMIG) + "\n"
	if allow != "" {
		doc += "nvidia:\n  migProfileAllowlist:\n"
		for _, m := range config.Models() {
			var profiles []string
			for _, p := range strings.Split(allow, ",") {
				if _, ok := m.Profile(p); ok {
					profiles = append(profiles, p)
				}
			}
			if len(profiles) > 0 {
				doc += fmt.Sprintf("  - models: [%s]\n    profiles: [%s]\n", m.Key, strings.Join(profiles, ", "))
			}
		}
	}
	return GPUsOf(fixture.Inventory(t, "n", doc, models...))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func migPod(devices, memoryMiB int) *Request {
	return &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Index: 0, Devices: devices, MemoryMiB: memoryMiB}}}
}

// reserve records a fit's MIG assignments on the GPUs, as the plugin's cache does.
func reserve(gpus []GPU, res *Result) {
	for _, a := range res.Assignments {
		if a.Mode == api.ModeMIG {
			gpus[a.GPU].MIG = append(gpus[a.GPU].MIG, Instance{Profile: a.Profile, Placement: a.Placement})
		} else {
			gpus[a.GPU].Shares = append(gpus[a.GPU].Shares, Share{MemoryMiB: a.MemoryMiB, Cores: a.Cores})
		}
	}
}

func mustFit(t *testing.T, gpus []GPU, req *Request, opts Options) *Result {
	t.Helper()
	res, why := Fit(gpus, req, opts)
	if why != nil {
		t.Fatalf("does not fit: %v", why)
	}
	checkDisjoint(t, gpus, res)
	return res
}

// checkDisjoint fails if the fit overlaps a reservation or itself, or uses an illegal placement.
func checkDisjoint(t *testing.T, gpus []GPU, res *Result) {
	t.Helper()
	taken := map[int][]api.Placement{}
	for i, g := range gpus {
		for _, in := range g.MIG {
			taken[i] = append(taken[i], in.Placement)
		}
	}
	for _, a := range res.Assignments {
		if a.Mode != api.ModeMIG {
			continue
		}
		p, ok := gpus[a.GPU].Info.Profile(a.Profile)
		if !ok || !p.HasPlacement(a.Placement) {
			t.Fatalf("%s at %v is not a legal placement on %s", a.Profile, a.Placement, a.GPUUUID)
		}
		for _, pl := range taken[a.GPU] {
			if pl.Overlaps(a.Placement) {
				t.Fatalf("%s at %v overlaps %v on %s", a.Profile, a.Placement, pl, a.GPUUUID)
			}
		}
		taken[a.GPU] = append(taken[a.GPU], a.Placement)
	}
}

func TestSeedExample(t *testing.T) {
	gpus := inventoryOf(t, "", "", "NVIDIA A100-PCIE-40GB")
	res := mustFit(t, gpus, migPod(2, 8000), defaultOpts)
	want := []Assignment{
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: gpus[0].Info.ID, Mode: api.ModeMIG, Profile: "2g.10gb", Placement: api.Placement{Start: 0, Size: 2}, MemoryMiB: 9856, Cores: 29},
		{ContainerIndex: 0, DeviceIndex: 1, GPUUUID: gpus[0].Info.ID, Mode: api.ModeMIG, Profile: "2g.10gb", Placement: api.Placement{Start: 2, Size: 2}, MemoryMiB: 9856, Cores: 29},
	}
	if !slices.Equal(res.Assignments, want) {
		t.Errorf("seed example:\n%+v\nwant\n%+v", res.Assignments, want)
	}
	// The demo's third pod (one 2g.10gb) lands beside them, leaving 3g.20gb@4 free.
	reserve(gpus, res)
	res = mustFit(t, gpus, migPod(1, 8000), defaultOpts)
	if a := res.Assignments[0]; a.Profile != "2g.10gb" || a.Placement != (api.Placement{Start: 4, Size: 2}) {
		t.Errorf("third 2g.10gb: %+v", a)
	}
}

// TestSmallestProfile checks, for every model's default allowlist, that a request of exactly
// a profile's memory gets that profile and one MiB more gets the next larger one.
func TestSmallestProfile(t *testing.T) {
	for _, m := range config.Models() {
		t.Run(m.Key, func(t *testing.T) {
			gpus := inventoryOf(t, "", "", m.Key)
			profiles := gpus[0].Info.MigProfiles
			for i, p := range profiles {
				res := mustFit(t, gpus, migPod(1, p.MemoryMB), defaultOpts)
				if got := res.Assignments[0].Profile; got != p.Name {
					t.Errorf("%d MiB: got %s, want %s", p.MemoryMB, got, p.Name)
				}
				res, why := Fit(gpus, migPod(1, p.MemoryMB+1), defaultOpts)
				switch {
				case i+1 < len(profiles) && (why != nil || res.Assignments[0].Profile != profiles[i+1].Name):
					t.Errorf("%d MiB: got %v %v, want %s", p.MemoryMB+1, res, why, profiles[i+1].Name)
				case i+1 == len(profiles) && (why == nil || why.Reason != ReasonNoProfile):
					t.Errorf("%d MiB, more than the largest profile: got %v %v", p.MemoryMB+1, res, why)
				}
			}
		})
	}
}

func TestRequestResolution(t *testing.T) {
	gpus := inventoryOf(t, "", "", "A100-40GB")
	for _, tc := range []struct {
		name    string
		c       ContainerRequest
		opts    Options
		profile string
	}{
		{"whole GPU by default", ContainerRequest{Devices: 1}, defaultOpts, "7g.40gb"},
		{"default memory", ContainerRequest{Devices: 1}, Options{FragmentationAware: true, DefaultMemory: 5000}, "2g.10gb"},
		// A share of the GPU's memory slots: 50 % is 4 of 8 (as 20096 MiB, 50 % of the full
		// profile's 40192, it would be more than 3g.20gb's 19968 and take the whole GPU).
		{"half the GPU", ContainerRequest{Devices: 1, MemoryPercent: 50}, defaultOpts, "3g.20gb"},
		{"just over half", ContainerRequest{Devices: 1, MemoryPercent: 51}, defaultOpts, "7g.40gb"},
		{"100 percent", ContainerRequest{Devices: 1, MemoryPercent: 100}, defaultOpts, "7g.40gb"},
		{"memory wins over percentage", ContainerRequest{Devices: 1, MemoryMiB: 1000, MemoryPercent: 100}, defaultOpts, "1g.5gb"},
		{"cores shape the profile", ContainerRequest{Devices: 1, MemoryMiB: 1000, Cores: 30}, defaultOpts, "3g.20gb"},
		{"exact core share", ContainerRequest{Devices: 1, MemoryMiB: 1000, Cores: 29}, defaultOpts, "2g.10gb"},
		{"all cores", ContainerRequest{Devices: 1, MemoryMiB: 1000, Cores: 100}, defaultOpts, "7g.40gb"},
		{"default cores shape the profile", ContainerRequest{Devices: 1, MemoryMiB: 1000}, Options{FragmentationAware: true, DefaultCores: 30}, "3g.20gb"},
		{"the container's cores win over the default", ContainerRequest{Devices: 1, MemoryMiB: 1000, Cores: 10}, Options{FragmentationAware: true, DefaultCores: 30}, "1g.5gb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := mustFit(t, gpus, &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{tc.c}}, tc.opts)
			if got := res.Assignments[0].Profile; got != tc.profile {
				t.Errorf("got %s, want %s", got, tc.profile)
			}
		})
	}
}

// TestMemoryShareEveryModel: a memory percentage on MIG is that share of the GPU, on every
// modelled GPU with HAMi's default allowlist, and with every plain profile allowed, where the
// profile of a span with the most compute comes first (the H200's 4g.71gb has 64 of 132 SMs).
func TestMemoryShareEveryModel(t *testing.T) {
	percents := []int{10, 25, 50, 75, 100}
	defaults := map[string][5]string{
		"A30-24GB":                      {"1g.6gb", "1g.6gb", "2g.12gb", "4g.24gb", "4g.24gb"},
		"A100-40GB":                     {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb", "7g.40gb"},
		"A100-80GB":                     {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "7g.80gb"},
		"H100-80GB":                     {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "7g.80gb"},
		"H100-94GB":                     {"1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb", "7g.94gb"},
		"GH200-96GB":                    {"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb", "7g.96gb"},
		"H20-96GB":                      {"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb", "7g.96gb"},
		"H200-141GB":                    {"1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb", "7g.141gb"},
		"B200-180GB":                    {"1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb", "7g.180gb"},
		"RTX-PRO-6000-Blackwell-Server": {"1g.24gb", "1g.24gb", "2g.48gb", "4g.96gb", "4g.96gb"},
	}
	everyPlain := map[string][5]string{
		"A100-40GB":  {"1g.5gb", "2g.10gb", "4g.20gb", "7g.40gb", "7g.40gb"},
		"H200-141GB": {"1g.18gb", "2g.35gb", "4g.71gb", "7g.141gb", "7g.141gb"},
	}
	check := func(t *testing.T, gpus []GPU, want [5]string) {
		for i, pct := range percents {
			res, why := Fit(gpus, &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryPercent: pct}}}, defaultOpts)
			got := ""
			if why == nil {
				got = res.Assignments[0].Profile
			} else if why.Reason != ReasonNoProfile {
				t.Errorf("%d %%: refused for %s, want %s", pct, why.Reason, ReasonNoProfile)
			}
			if got != want[i] {
				t.Errorf("%d %%: %q, want %q", pct, got, want[i])
			}
		}
	}
	for _, m := range config.Models() {
		want, ok := defaults[m.Key]
		if !ok {
			t.Errorf("model %s: no expected profiles", m.Key)
			continue
		}
		t.Run(m.Key, func(t *testing.T) { check(t, inventoryOf(t, "", "", m.Key), want) })
	}
	for key, want := range everyPlain {
		t.Run(key+" every plain profile", func(t *testing.T) {
			m, _ := config.LookupModel(key)
			var plain []string
			for _, p := range m.Profiles {
				if !strings.ContainsAny(p.Name, "+-") {
					plain = append(plain, p.Name)
				}
			}
			check(t, inventoryOf(t, "", strings.Join(plain, ","), key), want)
		})
	}
}

// TestFragmentationBeatsFixedPreference is the case: on an A100-40GB with 1g.5gb,
// 2g.10gb and 3g.20gb allowed, pods of 1g, 1g, 2g and 3g arriving in that order all fit;
// HAMi's fixed preference (1g from the highest start, 2g from the lowest) strands the 3g.
func TestFragmentationBeatsFixedPreference(t *testing.T) {
	requests := []int{4000, 4000, 9000, 19000}
	run := func(opts Options) (placed []string, why *Refusal) {
		gpus := inventoryOf(t, "", "1g.5gb,2g.10gb,3g.20gb", "A100-40GB")
		for _, mem := range requests {
			res, why := Fit(gpus, migPod(1, mem), opts)
			if why != nil {
				return placed, why
			}
			checkDisjoint(t, gpus, res)
			reserve(gpus, res)
			a := res.Assignments[0]
			placed = append(placed, a.Profile+a.Placement.String())
		}
		return placed, nil
	}
	placed, why := run(defaultOpts)
	if why != nil {
		t.Fatalf("fragmentation-aware: placed %v, then %v", placed, why)
	}
	t.Logf("fragmentation-aware: %v", placed)
	hamiLike := defaultOpts
	hamiLike.FragmentationAware = false
	placed, why = run(hamiLike)
	if why == nil || why.Reason != ReasonFragmented {
		t.Fatalf("fixed preference should strand the 3g.20gb as fragmented: placed %v, %v", placed, why)
	}
	if want := []string{"1g.5gb[6,7)", "1g.5gb[5,6)", "2g.10gb[0,2)"}; !slices.Equal(placed, want) {
		t.Errorf("fixed preference placed %v, want HAMi's %v", placed, want)
	}
}

func TestCapacityExhaustionAndReuse(t *testing.T) {
	gpus := inventoryOf(t, "", "", "A100-40GB")
	for i := 0; i < 7; i++ {
		reserve(gpus, mustFit(t, gpus, migPod(1, 4000), defaultOpts))
	}
	_, why := Fit(gpus, migPod(1, 4000), defaultOpts)
	if why == nil || why.Reason != ReasonPlacementsTaken {
		t.Fatalf("8th 1g.5gb: %v", why)
	}
	if !strings.Contains(why.Detail, "container 0 device 0") || !strings.Contains(why.Detail, gpus[0].Info.ID) {
		t.Errorf("detail should name the container, device and GPU: %q", why.Detail)
	}
	// Free the instance at slot 3: the next pod reuses exactly that placement.
	freed := slices.IndexFunc(gpus[0].MIG, func(in Instance) bool { return in.Placement.Start == 3 })
	gpus[0].MIG = slices.Delete(gpus[0].MIG, freed, freed+1)
	res := mustFit(t, gpus, migPod(1, 4000), defaultOpts)
	if a := res.Assignments[0]; a.Placement != (api.Placement{Start: 3, Size: 1}) {
		t.Errorf("freed placement not reused: %+v", a)
	}
}

func TestRefusalReasons(t *testing.T) {
	a100 := func(reserved ...Instance) []GPU {
		gpus := inventoryOf(t, "", "", "A100-40GB")
		gpus[0].MIG = reserved
		return gpus
	}
	inst := func(profile string, start, size int) Instance {
		return Instance{Profile: profile, Placement: api.Placement{Start: start, Size: size}}
	}
	for _, tc := range []struct {
		name string
		gpus []GPU
		req  *Request
		want Reason
	}{
		{"too big", a100(), migPod(1, 50000), ReasonNoProfile},
		{"all placements taken", a100(inst("7g.40gb", 0, 8)), migPod(1, 4000), ReasonPlacementsTaken},
		{"fragmented", a100(inst("1g.5gb", 2, 1), inst("1g.5gb", 5, 1)), migPod(1, 19000), ReasonFragmented},
		{"placements of a profile taken", a100(inst("3g.20gb", 0, 4), inst("3g.20gb", 4, 4)), migPod(1, 19000), ReasonPlacementsTaken},
		{"every placement of a profile at its count", a100(inst("2g.10gb", 0, 2), inst("2g.10gb", 2, 2), inst("2g.10gb", 4, 2)), migPod(1, 9000), ReasonPlacementsTaken},
		{"no MIG GPU", inventoryOf(t, api.ModeHAMiCore, "", "A100-40GB"), migPod(1, 4000), ReasonNoMIGGPU},
		{"no GPU at all", nil, migPod(1, 4000), ReasonNoMIGGPU},
		{"type not selected", a100(), &Request{Mode: api.ModeMIG, UseTypes: []string{"h100"}, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 1}}}, ReasonNotSelected},
		{"more devices than fit", a100(), migPod(4, 19000), ReasonPlacementsTaken},
		{"hami-core GPU in MIG mode", unusable(api.ModeHAMiCore, "MIG mode is on"), &Request{Mode: api.ModeHAMiCore, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 1000}}}, ReasonUnusable},
		{"MIG GPU with MIG mode off", unusable(api.ModeMIG, "MIG mode is off"), migPod(1, 4000), ReasonUnusable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, why := Fit(tc.gpus, tc.req, defaultOpts)
			if why == nil || why.Reason != tc.want {
				t.Errorf("got %v, want %q", why, tc.want)
			}
			if why != nil && why.Reason == ReasonUnusable && !strings.Contains(why.Detail, tc.gpus[0].Info.Unusable) {
				t.Errorf("the refusal does not say why the GPU is unusable: %v", why)
			}
			terse := defaultOpts
			terse.Terse = true
			if _, t2 := Fit(tc.gpus, tc.req, terse); t2 == nil || t2.Reason != tc.want {
				t.Errorf("terse: got %v, want %q", t2, tc.want)
			}
		})
	}
}

// unusable is one A100 of a node of that mode that the device plugin published unusable.
func unusable(mode, why string) []GPU {
	return []GPU{{Info: api.GPU{ID: "GPU-u", Type: "NVIDIA A100-PCIE-40GB", Mode: mode, Health: true, Devmem: 40960, Devcore: 100, Unusable: why}}}
}

func TestMediaEngineRules(t *testing.T) {
	gpus := inventoryOf(t, "", "1g.5gb+me,1g.5gb,7g.40gb", "A100-40GB")
	me := &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 4000}}}
	// 1g.5gb and 1g.5gb+me have equal memory and slices: the plain one (first published) wins.
	res := mustFit(t, gpus, me, defaultOpts)
	if res.Assignments[0].Profile != "1g.5gb" {
		t.Fatalf("got %s", res.Assignments[0].Profile)
	}
	// With only +me published, one fits and the second is refused at the instance limit.
	gpus = inventoryOf(t, "", "1g.5gb+me,7g.40gb", "A100-40GB")
	reserve(gpus, mustFit(t, gpus, me, defaultOpts))
	if _, why := Fit(gpus, me, defaultOpts); why == nil || why.Reason != ReasonInstanceLimit {
		t.Errorf("second +me: %v", why)
	}
}

func TestSelectorsAndModes(t *testing.T) {
	gpus := append(inventoryOf(t, "", "", "A100-40GB"), inventoryOf(t, "", "", "H100-80GB")...)
	gpus[1].Info.Index, gpus[1].Info.ID = 1, "GPU-h100"
	one := func(r *Request) string {
		res := mustFit(t, gpus, r, defaultOpts)
		return res.Assignments[0].GPUUUID
	}
	base := ContainerRequest{Devices: 1, MemoryMiB: 4000}
	if got := one(&Request{Mode: api.ModeMIG, UseTypes: []string{"h100"}, Containers: []ContainerRequest{base}}); got != gpus[1].Info.ID {
		t.Errorf("use-gputype h100 chose %s", got)
	}
	if got := one(&Request{Mode: api.ModeMIG, NoUseTypes: []string{"a100"}, Containers: []ContainerRequest{base}}); got != gpus[1].Info.ID {
		t.Errorf("nouse-gputype a100 chose %s", got)
	}
	if got := one(&Request{Mode: api.ModeMIG, UseUUIDs: []string{gpus[1].Info.ID}, Containers: []ContainerRequest{base}}); got != gpus[1].Info.ID {
		t.Errorf("use-gpuuuid chose %s", got)
	}
	if got := one(&Request{Mode: api.ModeMIG, NoUseUUIDs: []string{gpus[0].Info.ID}, Containers: []ContainerRequest{base}}); got != gpus[1].Info.ID {
		t.Errorf("nouse-gpuuuid chose %s", got)
	}
	// No mode: a node with one MIG and one hami-core GPU serves either.
	mixed := append(inventoryOf(t, "", "", "A100-40GB"), inventoryOf(t, api.ModeHAMiCore, "", "A100-40GB")...)
	mixed[1].Info.Index, mixed[1].Info.ID = 1, "GPU-core"
	for _, mode := range []string{api.ModeMIG, api.ModeHAMiCore} {
		res := mustFit(t, mixed, &Request{Mode: mode, Containers: []ContainerRequest{base}}, defaultOpts)
		if res.Mode != mode || mixed[res.Assignments[0].GPU].Info.Mode != mode {
			t.Errorf("mode %s: got %+v", mode, res)
		}
	}
	if res := mustFit(t, mixed, &Request{Containers: []ContainerRequest{base}}, defaultOpts); res == nil {
		t.Error("either pool")
	}
}

func TestHAMiCoreSharing(t *testing.T) {
	gpus := inventoryOf(t, api.ModeHAMiCore, "", "A100-40GB", "A100-40GB")
	gpus[1].Info.Index = 1
	core := func(devices, mem, cores int) *Request {
		return &Request{Mode: api.ModeHAMiCore, Containers: []ContainerRequest{{Devices: devices, MemoryMiB: mem, Cores: cores}}}
	}
	// Spread (the hami-core default): two pods land on different GPUs.
	a := mustFit(t, gpus, core(1, 10000, 10), defaultOpts)
	reserve(gpus, a)
	b := mustFit(t, gpus, core(1, 10000, 10), defaultOpts)
	if a.Assignments[0].GPU == b.Assignments[0].GPU {
		t.Errorf("spread put both on GPU %d", a.Assignments[0].GPU)
	}
	reserve(gpus, b)
	// Binpack by annotation: on the fuller GPU (both equal: highest index, as HAMi).
	bin := core(1, 1000, 0)
	bin.GPUPolicy = api.PolicyBinpack
	if r := mustFit(t, gpus, bin, defaultOpts); r.Assignments[0].GPU != 1 {
		t.Errorf("binpack tie went to %d", r.Assignments[0].GPU)
	}
	// A container's devices are distinct GPUs: 3 on 2 GPUs cannot fit.
	if _, why := Fit(gpus, core(3, 1000, 0), defaultOpts); why == nil || why.Reason != ReasonShareLimit {
		t.Errorf("3 devices on 2 GPUs: %v", why)
	}
	// Memory limit.
	if _, why := Fit(gpus, core(1, 40000, 0), defaultOpts); why == nil || !strings.Contains(why.Detail, "MiB free") {
		t.Errorf("memory limit: %v", why)
	}
	// Exclusive use needs an unshared GPU.
	if _, why := Fit(gpus, core(1, 1000, 100), defaultOpts); why == nil || why.Reason != ReasonShareLimit {
		t.Errorf("exclusive on shared GPUs: %v", why)
	}
	fresh := inventoryOf(t, api.ModeHAMiCore, "", "A100-40GB")
	reserve(fresh, mustFit(t, fresh, core(1, 1000, 100), defaultOpts))
	if _, why := Fit(fresh, core(1, 1000, 0), defaultOpts); why == nil || !strings.Contains(why.Detail, "exclusively") {
		t.Errorf("share beside an exclusive one: %v", why)
	}
	// Share count.
	few := inventoryOf(t, api.ModeHAMiCore, "", "A100-40GB")
	few[0].Info.Count = 2
	reserve(few, mustFit(t, few, core(1, 1000, 0), defaultOpts))
	reserve(few, mustFit(t, few, core(1, 1000, 0), defaultOpts))
	if _, why := Fit(few, core(1, 1000, 0), defaultOpts); why == nil || !strings.Contains(why.Detail, "shares are taken") {
		t.Errorf("share count: %v", why)
	}
}

func TestInitAndAppContainersDisjoint(t *testing.T) {
	gpus := inventoryOf(t, "", "", "A100-40GB")
	req := &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{
		{Index: 0, Devices: 1, MemoryMiB: 19000}, // init container
		{Index: 1, Devices: 1, MemoryMiB: 19000},
	}}
	res := mustFit(t, gpus, req, defaultOpts)
	if res.Assignments[0].ContainerIndex != 0 || res.Assignments[1].ContainerIndex != 1 ||
		res.Assignments[0].Placement.Overlaps(res.Assignments[1].Placement) {
		t.Errorf("%+v", res.Assignments)
	}
}

// TestRandomFitsNeverOverlap fills random GPU mixes with random requests and checks every
// fit against what is already reserved.
func TestRandomFitsNeverOverlap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	models := config.ModelKeys()
	for round := 0; round < 30; round++ {
		var picked []string
		for i := 0; i < 1+rng.IntN(4); i++ {
			picked = append(picked, models[rng.IntN(len(models))])
		}
		gpus := inventoryOf(t, "", "", picked...)
		for i := range gpus {
			gpus[i].Info.Index = uint(i)
		}
		opts := defaultOpts
		opts.FragmentationAware = rng.IntN(2) == 0
		for pod := 0; pod < 40; pod++ {
			req := migPod(1+rng.IntN(2), 1+rng.IntN(60000))
			res, why := Fit(gpus, req, opts)
			if why != nil {
				if why.Reason == ReasonNone || why.Detail == "" {
					t.Fatalf("refusal without a reason: %+v", why)
				}
				continue
			}
			checkDisjoint(t, gpus, res)
			reserve(gpus, res)
		}
	}
}

// TestBinpackNodeOrder: binpack picks the fit of lowest fragmentation cost, then a node in
// use over an empty one, then the first node by name, whatever how full the nodes are;
// without fragmentation awareness the cost does not count.
func TestBinpackNodeOrder(t *testing.T) {
	half := Instance{Profile: "3g.20gb", Placement: api.Placement{Start: 0, Size: 4}}
	full := Instance{Profile: "7g.40gb", Placement: api.Placement{Start: 0, Size: 8}}
	node := func(used ...Instance) []GPU {
		gpus := inventoryOf(t, "", "", "A100-40GB", "A100-40GB", "A100-40GB")
		for i, in := range used {
			gpus[i].MIG = []Instance{in}
		}
		return gpus
	}
	opts := Options{MIGPolicy: api.PolicyBinpack, FragmentationAware: true}
	for _, tc := range []struct {
		name   string
		nodes  map[string][]GPU
		memMiB int
		aware  bool
		want   string
	}{
		// A 1g next to a 3g destroys fewer placements than on an empty GPU: "b" although "a" is fuller.
		{"lower cost wins", map[string][]GPU{"a": node(full), "b": node(half)}, 4000, true, "b"},
		// Without awareness both are in use: the first name.
		{"cost off", map[string][]GPU{"a": node(full), "b": node(half)}, 4000, false, "a"},
		// A whole GPU costs the same anywhere: the node in use, not the empty one before it.
		{"in use before empty", map[string][]GPU{"a": node(), "b": node(half)}, 40000, true, "b"},
		// Equal cost, both in use: the first name, not the fuller "b".
		{"first name, not fullest", map[string][]GPU{"a": node(half), "b": node(full, half)}, 40000, true, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var names []string
			var scores []int64
			for name, gpus := range tc.nodes {
				res := mustFit(t, gpus, migPod(1, tc.memMiB), opts)
				names = append(names, name)
				scores = append(scores, NodeScore(NodeUtilisation(gpus, res), 0, InUse(gpus), res.Cost, api.PolicyBinpack, tc.aware))
			}
			NormalizeScores(names, scores, api.PolicyBinpack)
			best := slices.Index(scores, MaxNodeScore)
			if best < 0 || names[best] != tc.want || slices.Contains(scores[best+1:], MaxNodeScore) {
				t.Errorf("normalised %v for %v; want %s alone at %d", scores, names, tc.want, MaxNodeScore)
			}
		})
	}
}

func TestNormalizeScores(t *testing.T) {
	for _, tc := range []struct {
		policy string
		names  []string
		raw    []int64
		want   []int64
	}{
		{api.PolicyBinpack, []string{"c", "a", "b"}, []int64{5, 5, 7}, []int64{0, 50, 100}},
		{api.PolicyBinpack, []string{"only"}, []int64{-3}, []int64{100}},
		{api.PolicySpread, []string{"c", "a", "b"}, []int64{5, 5, 7}, []int64{0, 0, 100}},
		{api.PolicySpread, []string{"a", "b"}, []int64{4, 4}, []int64{100, 100}},
		{api.PolicySpread, []string{"a", "b", "c"}, []int64{0, 1, 4}, []int64{0, 25, 100}},
	} {
		got := slices.Clone(tc.raw)
		NormalizeScores(tc.names, got, tc.policy)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s %v %v: %v, want %v", tc.policy, tc.names, tc.raw, got, tc.want)
		}
	}
	// Binpack with more nodes than scores: neighbours share one, the order holds.
	names := make([]string, 250)
	raw := make([]int64, 250)
	for i := range names {
		names[i] = fmt.Sprintf("n%03d", i)
	}
	NormalizeScores(names, raw, api.PolicyBinpack)
	if raw[0] != MaxNodeScore || raw[249] != 0 || !slices.IsSortedFunc(raw, func(a, b int64) int { return cmp.Compare(b, a) }) {
		t.Errorf("250 equal nodes: %v", raw)
	}
}

// TestNUMABind: with nvidia.com/numa-bind a pod's devices share one NUMA node: the first
// with room, or the one left with room; refused with ReasonNUMA where the node has room only
// across NUMA nodes, which the same pod without the binding uses. Four A100-40GB, two per
// NUMA node.
func TestNUMABind(t *testing.T) {
	node := func(taken ...int) []GPU {
		gpus := inventoryOf(t, "", "", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB")
		for i := range gpus {
			gpus[i].Info.Numa = i / 2
		}
		for _, i := range taken {
			gpus[i].MIG = append(gpus[i].MIG, Instance{Profile: "7g.40gb", Placement: api.Placement{Start: 0, Size: 8}})
		}
		return gpus
	}
	pod := func(bind bool) *Request {
		return &Request{Mode: api.ModeMIG, NUMABind: bind, Containers: []ContainerRequest{{Devices: 1, MemoryPercent: 100}, {Index: 1, Devices: 1, MemoryPercent: 100}}}
	}
	numas := func(gpus []GPU, res *Result) []int {
		var out []int
		for _, a := range res.Assignments {
			out = append(out, gpus[a.GPU].Info.Numa)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		taken []int
		bind  bool
		want  []int // NUMA node of each device; nil: refused for the binding
	}{
		{"empty node", nil, true, []int{0, 0}},
		{"NUMA node 0 half full", []int{0}, true, []int{1, 1}},
		{"room only across NUMA nodes", []int{0, 2}, true, nil},
		{"the same without the binding", []int{0, 2}, false, []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := node(tc.taken...)
			res, why := Fit(gpus, pod(tc.bind), defaultOpts)
			switch {
			case tc.want == nil && (why == nil || why.Reason != ReasonNUMA):
				t.Errorf("got %v %v, want refused for %q", res, why, ReasonNUMA)
			case tc.want != nil && why != nil:
				t.Errorf("refused: %v", why)
			case tc.want != nil && !slices.Equal(numas(gpus, res), tc.want):
				t.Errorf("NUMA nodes %v, want %v", numas(gpus, res), tc.want)
			}
		})
	}
	// A node whose GPUs are full is refused for that, not for the binding.
	if _, why := Fit(node(0, 1, 2, 3), pod(true), defaultOpts); why == nil || why.Reason == ReasonNUMA {
		t.Errorf("a full node: %v, want its own reason", why)
	}
}

// TestReasonRank: refusals rank in the order Reasons lists them, ReasonNone below all.
func TestReasonRank(t *testing.T) {
	if r := ReasonNone.rank(); r != 0 {
		t.Errorf("ReasonNone ranks %d, want 0", r)
	}
	for i, r := range Reasons {
		if r.rank() != i+1 {
			t.Errorf("%q ranks %d, want %d (its place in Reasons)", r, r.rank(), i+1)
		}
	}
}
