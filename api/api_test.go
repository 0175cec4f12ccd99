package api

import (
	"encoding/json"
	"strings"
	"testing"
)

func u32(v uint32) *uint32 { return &v }

func TestPlacementOverlapIsHalfOpen(t *testing.T) {
	for _, tc := range []struct {
		a, b Placement
		want bool
	}{
		{Placement{0, 2}, Placement{2, 2}, false}, // touching ends do not overlap
		{Placement{2, 2}, Placement{0, 2}, false},
		{Placement{0, 4}, Placement{2, 2}, true},
		{Placement{0, 8}, Placement{7, 1}, true},
		{Placement{3, 1}, Placement{3, 1}, true},
		{Placement{0, 1}, Placement{1, 1}, false},
		{Placement{4, 4}, Placement{0, 4}, false},
		{Placement{4, 4}, Placement{6, 2}, true},
	} {
		if got := tc.a.Overlaps(tc.b); got != tc.want {
			t.Errorf("%v overlaps %v: got %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParseProfileName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want ProfileName
		ok   bool
	}{
		{"1g.5gb", ProfileName{1, 5, ""}, true},
		{"7g.141gb", ProfileName{7, 141, ""}, true},
		{"1g.10gb+me", ProfileName{1, 10, "+me"}, true},
		{"2g.48gb-me", ProfileName{2, 48, "-me"}, true},
		{"1g.24gb+me.all", ProfileName{1, 24, "+me.all"}, true},
		{"4g.96gb+gfx", ProfileName{4, 96, "+gfx"}, true},
		{"2g10gb", ProfileName{}, false},
		{"0g.5gb", ProfileName{}, false},
		{"1g.5GB", ProfileName{}, false},
		{"1g.5gb+xx", ProfileName{}, false},
		{"", ProfileName{}, false},
		{" 1g.5gb", ProfileName{}, false},
	} {
		got, err := ParseProfileName(tc.name)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseProfileName(%q) = %v, %v; want %v ok=%v", tc.name, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String() != tc.name {
			t.Errorf("String() = %q, want %q", got.String(), tc.name)
		}
	}
}

// seedInventory is an A100-PCIE-40GB as the device plugin publishes it: index and numa 0
// are written out.
const seedInventory = `[{"id":"GPU-1","index":0,"count":7,"devmem":40192,"devcore":100,"type":"NVIDIA A100-PCIE-40GB","numa":0,"mode":"mig","health":true,` +
	`"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":6,"size":1}],"instances":7},` +
	`{"name":"2g.10gb","memoryMB":9856,"core":29,"sliceCount":2,"placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}],"instances":3}],` +
	`"model":"A100-40GB","slots":8},` +
	`{"id":"GPU-2","index":1,"count":10,"devmem":40960,"devcore":100,"type":"NVIDIA A100-PCIE-40GB","numa":0,"mode":"hami-core","health":true}]`

func TestDecodeInventory(t *testing.T) {
	gpus, err := DecodeInventory(seedInventory)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 || gpus[0].ID != "GPU-1" || gpus[1].Index != 1 || gpus[0].SlotCount() != 8 {
		t.Fatalf("decoded: %+v", gpus)
	}
	p, ok := gpus[0].Profile("2g.10gb")
	if !ok || !p.HasPlacement(Placement{2, 2}) || p.HasPlacement(Placement{6, 2}) {
		t.Errorf("profile lookup: %+v", p)
	}
	// Round trip keeps HAMi's omitempty shape: index 0 is omitted as HAMi omits it.
	out, err := EncodeInventory(gpus)
	if err != nil {
		t.Fatal(err)
	}
	if out != seedInventory {
		t.Errorf("round trip changed the annotation:\n%s\n%s", out, seedInventory)
	}
}

func TestDecodeInventoryErrors(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"empty", ``, []string{"hami.io/node-nvidia-register: Required"}},
		{"not json", `[{"id":`, []string{"hami.io/node-nvidia-register", "not valid JSON"}},
		{"object not array", `{"id":"GPU-1"}`, []string{"hami.io/node-nvidia-register", "array"}},
		{"wrong type", `[{"id":"GPU-1","mode":"mig","devmem":"lots"}]`, []string{"hami.io/node-nvidia-register[0].devmem", "integer"}},
		{"nested wrong type", `[{"id":"GPU-1","mode":"mig","migProfiles":[{"name":"1g.5gb","placements":[{"start":"a"}]}]}]`, []string{"[0].migProfiles.placements.start"}},
		{"missing id", `[{"mode":"mig"}]`, []string{"[0].id: Required"}},
		{"duplicate id", `[{"id":"GPU-1","mode":"mig"},{"id":"GPU-1","index":1,"mode":"mig"}]`, []string{"[1].id: Duplicate"}},
		{"duplicate index", `[{"id":"GPU-1","mode":"mig"},{"id":"GPU-2","mode":"mig"}]`, []string{"[1].index: Duplicate"}},
		{"bad mode", `[{"id":"GPU-1","mode":"mps"}]`, []string{"[0].mode", `"mps"`}},
		{"profiles on hami-core", `[{"id":"GPU-1","mode":"hami-core","migProfiles":[{"name":"1g.5gb","memoryMB":1,"core":1,"sliceCount":1,"placements":[{"start":0,"size":1}]}]}]`, []string{"[0].migProfiles: Forbidden"}},
		{"bad profile name", `[{"id":"GPU-1","mode":"mig","migProfiles":[{"name":"big","memoryMB":1,"core":1,"sliceCount":1,"placements":[{"start":0,"size":1}]}]}]`, []string{"[0].migProfiles[0].name", `"big"`}},
		{"placement outside slots", `[{"id":"GPU-1","mode":"mig","slots":8,"migProfiles":[{"name":"1g.5gb","memoryMB":1,"core":1,"sliceCount":1,"placements":[{"start":8,"size":1}]}]}]`, []string{"[0].migProfiles[0].placements[0]", "[8,9)", "8 memory slots"}},
		{"core out of range", `[{"id":"GPU-1","mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":1,"core":101,"sliceCount":1,"placements":[{"start":0,"size":1}]}]}]`, []string{"[0].migProfiles[0].core"}},
		{"negative count", `[{"id":"GPU-1","mode":"mig","count":-1}]`, []string{"[0].count"}},
		{"unexplained instance on hami-core", `[{"id":"GPU-1","mode":"hami-core","unexplainedInstances":[{"profile":"1g.5gb","placement":{"start":0,"size":1}}]}]`, []string{"[0].unexplainedInstances[0]: Forbidden"}},
		{"unexplained instance outside slots", `[{"id":"GPU-1","mode":"mig","slots":8,"unexplainedInstances":[{"profile":"1g.5gb","placement":{"start":7,"size":2}}]}]`, []string{"[0].unexplainedInstances[0].placement", "[7,9)"}},
		{"unexplained instance's profile", `[{"id":"GPU-1","mode":"mig","slots":8,"unexplainedInstances":[{"profile":"most","placement":{"start":0,"size":1}}]}]`, []string{"[0].unexplainedInstances[0].profile", `"most"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeInventory(tc.raw)
			if err == nil {
				t.Fatal("decoded without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestDecodeMigReservations(t *testing.T) {
	raw := `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":0,"size":2}},` +
		`{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":2,"size":2},"migUUID":"MIG-a","gpuInstanceID":3,"computeInstanceID":0}]`
	recs, err := DecodeMigReservations(raw)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Realized() || !recs[1].Realized() || *recs[1].GPUInstanceID != 3 || *recs[1].ComputeInstanceID != 0 {
		t.Errorf("runtime identity: %+v", recs)
	}
	// containerIndex/deviceIndex may be absent (HAMi-style omitempty) and mean 0.
	if recs, err := DecodeMigReservations(`[{"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":6,"size":1}}]`); err != nil || recs[0].Key() != (ReservationKey{}) {
		t.Errorf("absent indexes: %v %v", recs, err)
	}
}

func TestEncodeMigReservationsIsCanonical(t *testing.T) {
	a := []MigReservation{
		{ContainerIndex: 1, DeviceIndex: 0, GPUUUID: "GPU-1", Profile: "1g.5gb", Placement: Placement{0, 1}},
		{ContainerIndex: 0, DeviceIndex: 1, GPUUUID: "GPU-1", Profile: "1g.5gb", Placement: Placement{1, 1}},
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: "GPU-1", Profile: "1g.5gb", Placement: Placement{2, 1}},
	}
	b := []MigReservation{a[2], a[0], a[1]}
	ea, err := EncodeMigReservations(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, _ := EncodeMigReservations(b)
	if ea != eb {
		t.Errorf("encoding depends on order:\n%s\n%s", ea, eb)
	}
	if !strings.HasPrefix(ea, `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":2,"size":1}}`) {
		t.Errorf("encoding: %s", ea)
	}
	if strings.Contains(ea, "migUUID") {
		t.Errorf("absent runtime identity must be omitted: %s", ea)
	}
	a[0].SetRuntime("MIG-x", 0, 0)
	ea, _ = EncodeMigReservations(a)
	if !strings.Contains(ea, `"migUUID":"MIG-x","gpuInstanceID":0,"computeInstanceID":0`) {
		t.Errorf("GI/CI id 0 must be written: %s", ea)
	}
	if _, err := EncodeMigReservations([]MigReservation{{GPUUUID: "GPU-1", Profile: "x"}}); err == nil {
		t.Errorf("invalid records must not encode")
	}
}

func TestDecodeMigReservationsErrors(t *testing.T) {
	rec := func(fields string) string {
		return `{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1}` + fields + `}`
	}
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"empty", ``, []string{"hami.io/vgpu-mig-allocations: Required"}},
		{"truncated", `[` + rec(``), []string{"not valid JSON"}},
		{"string index", `[{"containerIndex":"0"}]`, []string{"hami.io/vgpu-mig-allocations[0].containerIndex", "integer"}},
		{"gi id negative", `[` + rec(`,"migUUID":"MIG-1","gpuInstanceID":-1,"computeInstanceID":0`) + `]`, []string{"[0].gpuInstanceID"}},
		{"negative container", `[{"containerIndex":-1,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1}}]`, []string{"[0].containerIndex"}},
		{"no gpu", `[{"profile":"1g.5gb","placement":{"start":0,"size":1}}]`, []string{"[0].gpuUUID: Required"}},
		{"bad profile", `[{"gpuUUID":"GPU-1","profile":"1g5gb","placement":{"start":0,"size":1}}]`, []string{"[0].profile", `"1g5gb"`}},
		{"zero size", `[{"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":0}}]`, []string{"[0].placement.size"}},
		{"negative start", `[{"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":-1,"size":1}}]`, []string{"[0].placement.start"}},
		{"partial runtime", `[` + rec(`,"migUUID":"MIG-1"`) + `]`, []string{"[0]", "runtime identity must be complete"}},
		{"partial runtime ids", `[` + rec(`,"gpuInstanceID":1,"computeInstanceID":0`) + `]`, []string{"runtime identity must be complete"}},
		{"bad mig uuid", `[` + rec(`,"migUUID":"GPU-1","gpuInstanceID":1,"computeInstanceID":0`) + `]`, []string{"[0].migUUID", "MIG-"}},
		{"duplicate key", `[` + rec(``) + `,{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-2","profile":"1g.5gb","placement":{"start":0,"size":1}}]`, []string{"[1]: Duplicate", "containerIndex 0, deviceIndex 0"}},
		{"too many", `[` + strings.Repeat(rec(``)+`,`, 128) + rec(``) + `]`, []string{"hami.io/vgpu-mig-allocations", "129", "at most 128"}},
		{"overlap", `[{"deviceIndex":0,"gpuUUID":"GPU-1","profile":"3g.20gb","placement":{"start":0,"size":4}},{"deviceIndex":1,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":2,"size":2}}]`, []string{"[1].placement", "[2,4)", "overlaps record 0's [0,4)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMigReservations(tc.raw)
			if err == nil {
				t.Fatal("decoded without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// Touching placements and equal placements on different GPUs are fine.
	ok := `[{"deviceIndex":0,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":0,"size":2}},` +
		`{"deviceIndex":1,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":2,"size":2}},` +
		`{"deviceIndex":2,"gpuUUID":"GPU-2","profile":"2g.10gb","placement":{"start":0,"size":2}}]`
	if _, err := DecodeMigReservations(ok); err != nil {
		t.Errorf("valid reservations refused: %v", err)
	}
}

func TestValidateAgainstInventory(t *testing.T) {
	gpus, err := DecodeInventory(seedInventory)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rec  MigReservation
		want string // "" means valid
	}{
		{"legal", MigReservation{GPUUUID: "GPU-1", Profile: "2g.10gb", Placement: Placement{2, 2}}, ""},
		{"unknown gpu", MigReservation{GPUUUID: "GPU-9", Profile: "2g.10gb", Placement: Placement{2, 2}}, "[0].gpuUUID: Not found"},
		{"hami-core gpu", MigReservation{GPUUUID: "GPU-2", Profile: "2g.10gb", Placement: Placement{2, 2}}, `mode "hami-core"`},
		{"unpublished profile", MigReservation{GPUUUID: "GPU-1", Profile: "3g.20gb", Placement: Placement{0, 4}}, "does not offer"},
		{"illegal placement", MigReservation{GPUUUID: "GPU-1", Profile: "2g.10gb", Placement: Placement{1, 2}}, "not a legal placement of 2g.10gb"},
		{"outside slots", MigReservation{GPUUUID: "GPU-1", Profile: "2g.10gb", Placement: Placement{7, 2}}, "inside the GPU's 8 memory slots"},
	} {
		errs := ValidateAgainstInventory([]MigReservation{tc.rec}, gpus)
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("%s: %v", tc.name, errs)
		case tc.want != "" && !strings.Contains(errs.ToAggregate().Error(), tc.want):
			t.Errorf("%s: error %v lacks %q", tc.name, errs, tc.want)
		}
	}
}

func TestLeaseNames(t *testing.T) {
	if HeartbeatLeaseName("n1") != "dynamig-heartbeat-n1" {
		t.Error("lease names")
	}
}

func FuzzDecodeInventory(f *testing.F) {
	f.Add(seedInventory)
	f.Add(`[]`)
	f.Add(`[{"id":"GPU-1","mode":"mig","migProfiles":[{"name":"1g.5gb","placements":[{"start":-1,"size":9}]}]}]`)
	f.Add(`[{"devmem":1e99}]`)
	f.Fuzz(func(t *testing.T, raw string) {
		gpus, err := DecodeInventory(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		// Whatever decodes encodes, and decodes again to the same.
		out, err := EncodeInventory(gpus)
		if err != nil {
			t.Fatalf("valid inventory does not encode: %v", err)
		}
		again, err := DecodeInventory(out)
		if err != nil || len(again) != len(gpus) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func FuzzDecodeMigReservations(f *testing.F) {
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":0,"size":2}}]`)
	f.Add(`[{"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1},"migUUID":"MIG-1","gpuInstanceID":1,"computeInstanceID":0}]`)
	f.Add(`[{"containerIndex":9223372036854775807}]`)
	f.Fuzz(func(t *testing.T, raw string) {
		recs, err := DecodeMigReservations(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		// Valid reservations never overlap and re-encode canonically.
		if len(Overlaps(recs)) != 0 {
			t.Fatal("overlapping reservations decoded as valid")
		}
		out, err := EncodeMigReservations(recs)
		if err != nil {
			t.Fatalf("valid reservations do not encode: %v", err)
		}
		var back []MigReservation
		if err := json.Unmarshal([]byte(out), &back); err != nil || len(back) != len(recs) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}
