package app

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/inspect"
	"github.com/dynamig/dynamig/test/fixture"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// seed is the seed example's cluster: an A100-PCIE-40GB holding gpu-pod1's two 2g.10gb at
// [0,2) and [2,4) and mig-workload's at [4,6), and a hami-core node with one share.
func seed(t *testing.T) *inspect.Cluster {
	t.Helper()
	mig := fixture.Inventory(t, "mig-node", fixture.ModeConfig("mig-node", api.ModeMIG), "A100-PCIE-40GB")[0]
	mig.ID = "GPU-1e4b6a9d-4fff-a516-3e24-1d86151d01bc"
	core := api.GPU{ID: "GPU-d7433ef1-6800-7560-ce0d-135ac7eef641", Type: "NVIDIA A100-SXM4-40GB", Mode: api.ModeHAMiCore, Health: true, Count: 10, Devmem: 40960, Devcore: 100}
	nodes := []v1.Node{invNode(t, "mig-node", mig), invNode(t, "core-node", core)}
	rec := func(dev, start int, uuid string) api.MigReservation {
		r := api.MigReservation{DeviceIndex: dev, GPUUUID: mig.ID, Profile: "2g.10gb", Placement: api.Placement{Start: start, Size: 2}}
		r.SetRuntime(uuid, uint32(start/2+1), 0)
		return r
	}
	pods := []v1.Pod{
		migPod(t, "gpu-pod1", now.Add(-2*time.Minute), rec(0, 0, "MIG-aaaaaaaa-1111-2222-3333-444444444444"), rec(1, 2, "MIG-bbbbbbbb-1111-2222-3333-444444444444")),
		migPod(t, "mig-workload", now.Add(-time.Minute), rec(0, 4, "MIG-cccccccc-1111-2222-3333-444444444444")),
		{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "team-a", CreationTimestamp: metav1.Time{Time: now.Add(-time.Hour)}, Annotations: map[string]string{
			api.DevicesAllocatedAnnotation: api.EncodeHAMiCoreDevices([][]api.HAMiCoreDevice{{{UUID: core.ID, Type: "NVIDIA", MemoryMiB: 4000, Cores: 30}}}),
			api.BindPhaseAnnotation:        api.BindPhaseSuccess}}, Spec: v1.PodSpec{NodeName: "core-node"}, Status: v1.PodStatus{Phase: v1.PodRunning}},
	}
	var leases []coordinationv1.Lease
	for _, n := range []string{"mig-node", "core-node"} {
		leases = append(leases, coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeasePrefix + n},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now.Add(-5 * time.Second)}, LeaseDurationSeconds: ptr.To[int32](40)}})
	}
	return inspect.Build(nodes, pods, leases, api.ResourceCount, now)
}

func invNode(t *testing.T, name string, gpus ...api.GPU) v1.Node {
	t.Helper()
	raw, err := api.EncodeInventory(gpus)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{api.NodeInventoryAnnotation: raw}}}
}

func migPod(t *testing.T, name string, created time.Time, recs ...api.MigReservation) v1.Pod {
	t.Helper()
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: metav1.Time{Time: created},
		Annotations: map[string]string{api.MigReservationsAnnotation: raw, api.BindPhaseAnnotation: api.BindPhaseSuccess}},
		Spec: v1.PodSpec{NodeName: "mig-node"}, Status: v1.PodStatus{Phase: v1.PodRunning}}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (run go test -update to accept it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestTableOutput: the table output as a user sees it, for the seed example.
func TestTableOutput(t *testing.T) {
	c := seed(t)
	for _, tc := range []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"nodes.golden", func(b *bytes.Buffer) error { return writeNodes(b, c.Nodes, false, now, false) }},
		{"nodes-wide.golden", func(b *bytes.Buffer) error { return writeNodes(b, c.Nodes, true, now, false) }},
		{"pods.golden", func(b *bytes.Buffer) error { return writePods(b, c.Pods, true, false, now, false) }},
		{"models.golden", func(b *bytes.Buffer) error { return writeModels(b, modelTable(), false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

// TestExplainOutput: a 3g.20gb pod on the seed cluster: the MIG node has no free 3g placement,
// the hami-core node is not of the pod's mode.
func TestExplainOutput(t *testing.T) {
	c := seed(t)
	nodes := []v1.Node{}
	for _, n := range c.Nodes {
		var inv []api.GPU
		for _, g := range n.GPUs {
			inv = append(inv, g.GPU)
		}
		nodes = append(nodes, invNode(t, n.Name, inv...))
	}
	pods := []v1.Pod{}
	for _, p := range c.Pods {
		if p.Node == "mig-node" {
			pods = append(pods, migPod(t, p.Name, p.Created, p.Reservations...))
		}
	}
	var leases []coordinationv1.Lease
	for _, n := range []string{"mig-node", "core-node"} {
		leases = append(leases, coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeasePrefix + n},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now}, LeaseDurationSeconds: ptr.To[int32](40)}})
	}
	want := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "default", Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse("19000")}}}}}}
	args := &config.DynamicMIGArgs{}
	args.SetDefaults()
	e, err := inspect.Explain(want, nodes, pods, leases, &inspect.Policy{Args: args, Device: config.DefaultDeviceConfig()}, now)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeExplain(&b, want, "HAMi v2.10's defaults", e, false); err != nil {
		t.Fatal(err)
	}
	golden(t, "explain.golden", b.Bytes())
}

// TestJSONOutput: -o json is the documented schema (inspect's types), lossless.
func TestJSONOutput(t *testing.T) {
	c := seed(t)
	var b bytes.Buffer
	o := &options{output: outputJSON}
	o.streams.Out = &b
	if ok, err := o.print(map[string]any{"nodes": c.Nodes}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	var got struct {
		Nodes []inspect.Node `json:"nodes"`
	}
	dec := json.NewDecoder(&b)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes) != 2 || got.Nodes[1].Name != "mig-node" || len(got.Nodes[1].GPUs[0].Slots) != 4 ||
		got.Nodes[1].GPUs[0].Slots[2].Pod != "default/mig-workload" || got.Nodes[1].GPUs[0].Slots[2].MIGUUID == "" {
		t.Errorf("decoded: %+v", got.Nodes)
	}
}

func TestBadOutput(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main(t.Context(), []string{"models", "-o", "xml"}, &out, &errOut); code != 1 || !bytes.Contains(errOut.Bytes(), []byte(`--output "xml"`)) {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// TestColourKeepsColumns: painted tables line up as plain ones do once the colour codes are
// taken out, and output that is not a terminal is never painted.
func TestColourKeepsColumns(t *testing.T) {
	c := seed(t)
	ansi := regexp.MustCompile("\x1b\\[[0-9]+m")
	for name, write := range map[string]func(*bytes.Buffer, palette) error{
		"pods":  func(b *bytes.Buffer, p palette) error { return writePods(b, c.Pods, true, false, now, p) },
		"nodes": func(b *bytes.Buffer, p palette) error { return writeNodes(b, c.Nodes, false, now, p) },
	} {
		var plain, painted bytes.Buffer
		if err := write(&plain, false); err != nil {
			t.Fatal(err)
		}
		if err := write(&painted, true); err != nil {
			t.Fatal(err)
		}
		if !ansi.Match(painted.Bytes()) {
			t.Errorf("%s: nothing painted", name)
		}
		if got := ansi.ReplaceAll(painted.Bytes(), nil); !bytes.Equal(got, plain.Bytes()) {
			t.Errorf("%s: painted table, codes removed:\n%s\nplain:\n%s", name, got, plain.Bytes())
		}
	}
	o := &options{}
	o.streams.Out = &bytes.Buffer{}
	if o.colour() {
		t.Error("a buffer is not a terminal")
	}
}

// simulatePods is a pods file as a user writes it: MIG pods of several sizes, a hami-core
// pod, a Job of two, one that no node can hold and a CPU pod.
const simulatePods = `apiVersion: v1
kind: Pod
metadata: {name: small}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000}}}
---
apiVersion: v1
kind: Pod
metadata: {name: medium, annotations: {nvidia.com/vgpu-mode: mig}}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 19000}}}
---
apiVersion: v1
kind: Pod
metadata: {name: shared, annotations: {nvidia.com/vgpu-mode: hami-core}}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 8000, nvidia.com/gpucores: 30}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  parallelism: 2
  template:
    metadata: {annotations: {nvidia.com/vgpu-mode: mig}}
    spec:
      restartPolicy: Never
      containers:
      - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 39000}}}
---
apiVersion: v1
kind: Pod
metadata: {name: whole-h100, annotations: {nvidia.com/vgpu-mode: mig}}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 80000}}}
---
apiVersion: v1
kind: Pod
metadata: {name: cpu}
spec:
  containers:
  - {name: c, image: x}
`

// TestSimulateOutput: simulate on described nodes, run as a user runs it: the table (golden)
// and the JSON and YAML, decoded strictly into the documented types.
func TestSimulateOutput(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	file := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(file, []byte(simulatePods), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"simulate", "-f", file, "--nodes", "a100=2xA100-40GB,h100=H100-80GB,core=A100-40GB:hami-core"}
	var out, errOut bytes.Buffer
	if code := Main(t.Context(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	golden(t, "simulate.golden", out.Bytes())
	type result struct {
		Cluster string            `json:"cluster"`
		Policy  string            `json:"policy"`
		Pods    []inspect.Landing `json:"pods"`
	}
	for _, format := range []string{"json", "yaml"} {
		out.Reset()
		if code := Main(t.Context(), append(args, "-o", format), &out, &errOut); code != 0 {
			t.Fatalf("-o %s: exit %d: %s", format, code, errOut.String())
		}
		raw := out.Bytes()
		if format == "yaml" {
			var err error
			if raw, err = yaml.YAMLToJSON(raw); err != nil {
				t.Fatal(err)
			}
		}
		var got result
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("-o %s: %v", format, err)
		}
		if len(got.Pods) != 7 || got.Pods[4].Node != "a100" || len(got.Pods[5].Refusals) != 3 || got.Pods[6].Skipped == "" {
			t.Errorf("-o %s: %+v", format, got.Pods)
		}
	}
}
