package inspect

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// a100 is an A100-PCIE-40GB's inventory entry, as the device plugin publishes it with the
// default allowlist.
func a100(t *testing.T, id string) api.GPU {
	t.Helper()
	m, ok := config.LookupModel("A100-40GB")
	if !ok {
		t.Fatal("no A100-40GB in the model table")
	}
	g := api.GPU{ID: id, Type: "NVIDIA A100-PCIE-40GB", Mode: api.ModeMIG, Health: true, Slots: m.Slots, Count: 7, Devmem: m.MemoryMiB, Devcore: 100}
	for _, name := range []string{"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"} {
		p, _ := m.Profile(name)
		g.MigProfiles = append(g.MigProfiles, api.MigProfile{Name: p.Name, MemoryMB: p.MemoryMiB, Core: m.CorePercent(p), SliceCount: p.ParsedName().Slices, Placements: p.Placements.List(), Instances: p.Instances})
	}
	return g
}

func node(t *testing.T, name string, gpus ...api.GPU) v1.Node {
	t.Helper()
	raw, err := api.EncodeInventory(gpus)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{api.NodeInventoryAnnotation: raw}}}
}

func migPod(t *testing.T, name, nodeName, phase string, recs ...api.MigReservation) v1.Pod {
	t.Helper()
	for i := range recs {
		recs[i].DeviceIndex = i
	}
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{
		api.MigReservationsAnnotation: raw, api.BindPhaseAnnotation: phase}}, Spec: v1.PodSpec{NodeName: nodeName}}
}

func lease(node string, renewed time.Time) coordinationv1.Lease {
	return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeasePrefix + node},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To[int32](40)}}
}

func rec(gpu, profile string, start, size int) api.MigReservation {
	return api.MigReservation{GPUUUID: gpu, Profile: profile, Placement: api.Placement{Start: start, Size: size}}
}

func TestBuild(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	gpu := "GPU-1"
	realised := rec(gpu, "2g.10gb", 4, 2)
	realised.SetRuntime("MIG-9", 1, 0)
	failed := migPod(t, "lost", "n1", api.BindPhaseFailed, rec(gpu, "1g.5gb", 6, 1))
	failed.Annotations[BindFailureAnnotation] = "placement [6,7) is held by another pod's instance"
	ended := migPod(t, "done", "n1", api.BindPhaseSuccess, rec(gpu, "1g.5gb", 7, 1))
	ended.Status.Phase = v1.PodSucceeded
	pending := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "waiting", Namespace: "default"}, Spec: v1.PodSpec{Containers: []v1.Container{{
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}}}
	cpu := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default"}, Spec: v1.PodSpec{NodeName: "n1"}}
	pods := []v1.Pod{
		migPod(t, "two", "n1", api.BindPhaseAllocating, rec(gpu, "2g.10gb", 0, 2), rec(gpu, "2g.10gb", 2, 2)),
		migPod(t, "one", "n1", api.BindPhaseSuccess, realised),
		failed, ended, pending, cpu,
	}
	nodes := []v1.Node{node(t, "n1", a100(t, gpu)), node(t, "n2"), {ObjectMeta: metav1.ObjectMeta{Name: "cpu-node"}}, {ObjectMeta: metav1.ObjectMeta{Name: "n4"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n3", Annotations: map[string]string{api.NodeInventoryAnnotation: "{"}}}}
	c := Build(nodes, pods, []coordinationv1.Lease{lease("n1", now.Add(-10*time.Second)), lease("n2", now.Add(-time.Minute)), lease("n4", now)},
		api.ResourceCount, now)

	states := map[string]string{}
	for _, p := range c.Pods {
		states[p.Name] = p.State + "|" + p.Reason
	}
	for name, want := range map[string]string{"two": "reserved|", "one": "realised|", "lost": "failed|placement [6,7) is held by another pod's instance",
		"done": "ended|", "waiting": "pending|"} {
		if states[name] != want {
			t.Errorf("pod %s: state %q, want %q", name, states[name], want)
		}
	}
	if _, ok := states["cpu"]; ok {
		t.Error("a CPU pod is listed as a GPU pod")
	}

	byName := map[string]Node{}
	for _, n := range c.Nodes {
		byName[n.Name] = n
	}
	if _, ok := byName["cpu-node"]; ok {
		t.Error("a node without inventory or heartbeat is listed")
	}
	for name, want := range map[string][2]string{"n1": {"fresh", ""}, "n2": {"expired", ""}, "n3": {"missing", "not"}, "n4": {"fresh", "missing"}} {
		n := byName[name]
		if n.Heartbeat != want[0] || (want[1] == "" && n.Inventory != "") || (want[1] != "" && n.Inventory == "") {
			t.Errorf("node %s: heartbeat %q inventory %q, want %q and %q", name, n.Heartbeat, n.Inventory, want[0], want[1])
		}
	}

	g := byName["n1"].GPUs[0]
	var got []string
	for _, s := range g.Slots {
		got = append(got, s.Placement.String()+" "+s.Pod+" "+s.Profile)
	}
	// The failed pod's reservation still holds its slot (the device plugin evicts it); the
	// ended pod's does not.
	want := []string{"[0,2) default/two 2g.10gb", "[2,4) default/two 2g.10gb", "[4,6) default/one 2g.10gb", "[6,7) default/lost 1g.5gb", "[7,8)  "}
	if len(got) != len(want) {
		t.Fatalf("slots %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("slot %d: %q, want %q", i, got[i], want[i])
		}
	}
	room := map[string]ProfileRoom{}
	for _, r := range g.Room {
		room[r.Profile] = r
	}
	// Three 2g and a 1g hold all 7 compute slices: no 1g.5gb fits, whatever the free slot.
	if r := room["1g.5gb"]; r.More != 0 || len(r.Free) != 0 || r.Limit != "1g.5gb needs 1 compute slices and 0 of 7 are free" {
		t.Errorf("1g.5gb room: %+v", r)
	}
	if r := room["2g.10gb"]; r.More != 0 || len(r.Free) != 0 {
		t.Errorf("2g.10gb room: %+v", r)
	}
	if r := room["7g.40gb"]; r.More != 0 {
		t.Errorf("7g.40gb room: %+v", r)
	}
}

func TestRoomLimits(t *testing.T) {
	g := a100(t, "GPU-1")
	// Seven 1g.5gb: the profile's instance count is reached (slot [7,8) stays free, and no
	// 1g.5gb placement starts there).
	var used []SlotRange
	for i := range 7 {
		used = append(used, SlotRange{Placement: api.Placement{Start: i, Size: 1}, Pod: "p", Profile: "1g.5gb"})
	}
	out := buildGPU(g, "n", nil)
	if len(out.Room) != 4 || out.Room[0].More != 7 {
		t.Fatalf("empty GPU room: %+v", out.Room)
	}
	pods := []Pod{{Namespace: "d", Name: "p", Node: "n", State: "realised"}}
	for _, u := range used {
		pods[0].Reservations = append(pods[0].Reservations, rec("GPU-1", "1g.5gb", u.Placement.Start, 1))
	}
	out = buildGPU(g, "n", pods)
	r := out.Room[0]
	if r.Profile != "1g.5gb" || r.More != 0 || r.Limit != "1g.5gb has its 7 instances" || len(r.Free) != 0 {
		t.Errorf("full of 1g.5gb: %+v (want no room and the instance limit)", r)
	}
	if slots := out.Slots; len(slots) != 8 || slots[7].Pod != "" || slots[7].Placement != (api.Placement{Start: 7, Size: 1}) {
		t.Errorf("slots: %+v", slots)
	}
}

func TestExplain(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	args := &config.DynamicMIGArgs{}
	args.SetDefaults()
	device := config.DefaultDeviceConfig()
	gpu := "GPU-1"
	full := migPod(t, "full", "n1", api.BindPhaseSuccess, rec(gpu, "2g.10gb", 0, 2), rec(gpu, "2g.10gb", 2, 2), rec(gpu, "2g.10gb", 4, 2))
	nodes := []v1.Node{node(t, "n1", a100(t, gpu)), node(t, "n2", a100(t, "GPU-2")), node(t, "n3", a100(t, "GPU-3")), node(t, "n4", a100(t, "GPU-4"))}
	leases := []coordinationv1.Lease{lease("n1", now), lease("n2", now), lease("n3", now.Add(-time.Hour))}
	ask := func(mem string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "want", Namespace: "default", UID: "u"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse(mem)}}}}}}
	}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want map[string]string // node → reason ("" fits)
	}{
		{"3g.20gb", ask("19000"), map[string]string{"n1": string(placement.ReasonPlacementsTaken), "n2": "", "n3": "node's dynamig-device-plugin heartbeat expired", "n4": "node's dynamig-device-plugin heartbeat missing"}},
		{"no profile that big", ask("50000"), map[string]string{"n1": string(placement.ReasonNoProfile), "n2": string(placement.ReasonNoProfile)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Explain(tc.pod, nodes, []v1.Pod{full}, leases, args, device, now)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range got {
				want, ok := tc.want[v.Node]
				if !ok {
					continue
				}
				if v.Reason != want || v.Fits != (want == "") {
					t.Errorf("%s: fits %v reason %q (%s), want %q", v.Node, v.Fits, v.Reason, v.Detail, want)
				}
				if v.Fits && (len(v.Devices) != 1 || !strings.Contains(v.Devices[0], "3g.20gb [") || !strings.HasSuffix(v.Devices[0], "on GPU-2")) {
					t.Errorf("%s: devices %v", v.Node, v.Devices)
				}
			}
		})
	}
	if _, err := Explain(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}, nodes, nil, leases, args, device, now); err == nil || !strings.Contains(err.Error(), "not a GPU pod") {
		t.Errorf("CPU pod: %v", err)
	}
}
