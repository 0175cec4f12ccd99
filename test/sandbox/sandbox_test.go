package sandbox

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

const installFile = "../../manifests/install.yaml"

func TestMain(m *testing.M) {
	flag.Parse()
	cluster.QuietLogs(testing.Verbose())
	os.Exit(m.Run())
}

// TestSandbox starts the default world, runs the seed pods (and a hami-core pod), checks
// their reservations against the device plugin's instances, deletes one and finishes
// another, and stops, leaking neither goroutines nor files.
func TestSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	goroutinesBefore := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	s, err := Start(ctx, Options{Config: sandboxconfig.DefaultConfig(), Install: installFile})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	t.Logf("ready in %s", time.Since(start))
	files := []string{s.dir, s.cp.Dir}
	for _, n := range s.nodes {
		files = append(files, n.dir)
	}

	client := s.Client()
	nodes := s.Nodes()
	if len(nodes) != 2 || nodes[0].Name != "mig-node" || nodes[1].Name != "core-node" {
		t.Fatalf("nodes: %+v", nodes)
	}
	for _, n := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{"mig-node": 7, "core-node": 10}[n.Name] // A100-40GB: 7 1g instances; hami-core: deviceSplitCount
		if q := node.Status.Allocatable[api.ResourceCount]; q.Value() != want {
			t.Errorf("%s allocatable %s = %s, want %d", n.Name, api.ResourceCount, q.String(), want)
		}
		if len(n.GPUUUIDs) != 1 || !strings.HasPrefix(n.GPUUUIDs[0], "GPU-") || !strings.HasPrefix(n.DeviceMetrics, "http://127.0.0.1:") {
			t.Errorf("node info %+v", n)
		}
	}
	st := s.State(s.Kubeconfig())
	if st.APIServer == "" || st.Nodes["mig-node"].Mode != api.ModeMIG || st.Nodes["core-node"].GPUs[0] != "A100-40GB" {
		t.Errorf("state %+v", st)
	}

	// The seed pods, from examples/, and a hami-core pod.
	pods, err := cluster.ReadPods("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		p.Spec.RestartPolicy = v1.RestartPolicyNever // so that FinishPod ends them
	}
	core := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "core-workload", Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeHAMiCore}},
		Spec: v1.PodSpec{SchedulerName: "dynamig-scheduler", RestartPolicy: v1.RestartPolicyNever, Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse("4000")}}}}}}
	if _, err := s.CreatePods(ctx, append(pods, core)...); err != nil {
		t.Fatal(err)
	}
	running, err := s.WaitRunning(ctx, time.Minute, "default", "gpu-pod1", "mig-workload", "core-workload")
	if err != nil {
		t.Fatal(err)
	}
	var recs []api.MigReservation
	for _, p := range running[:2] {
		r, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "mig-node" || !podReady(p) {
			t.Errorf("%s: node %q, conditions %+v", p.Name, p.Spec.NodeName, p.Status.Conditions)
		}
		recs = append(recs, r...)
	}
	if len(recs) != 3 {
		t.Fatalf("want three reservations: %+v", recs)
	}
	for i, r := range recs {
		if r.Profile != "2g.10gb" || !r.Realized() || r.GPUUUID != nodes[0].GPUUUIDs[0] {
			t.Errorf("reservation %d: %+v", i, r)
		}
		for _, o := range recs[:i] {
			if o.Placement.Overlaps(r.Placement) || o.MigUUID == r.MigUUID {
				t.Errorf("overlap or shared instance: %+v and %+v", o, r)
			}
		}
	}
	if p := running[2]; p.Spec.NodeName != "core-node" || p.Annotations[api.DevicesAllocatedAnnotation] == "" {
		t.Errorf("core-workload: node %q, annotations %v", p.Spec.NodeName, p.Annotations)
	}

	// The device plugin's instances are the reservations.
	instances := func() []Instance {
		t.Helper()
		in, err := s.Instances("mig-node")
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	in := instances()
	if len(in) != 3 {
		t.Fatalf("instances: %v", in)
	}
	for _, r := range recs {
		if !slices.ContainsFunc(in, func(i Instance) bool {
			return i.Placement == r.Placement && i.Profile == r.Profile && i.GPUInstanceID == int(*r.GPUInstanceID) && i.PodNamespace == "default" && i.PodName != ""
		}) {
			t.Errorf("no instance for %+v in %v", r, in)
		}
	}
	if in, err := s.Instances("core-node"); err != nil || len(in) != 0 {
		t.Errorf("core-node instances: %v, %v", in, err)
	}
	occ, err := s.Occupancy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(occ) != 2 || !strings.HasSuffix(occ[0].String(), "(NVIDIA A100-PCIE-40GB): [0,2) gpu-pod1 2g.10gb | [2,4) gpu-pod1 2g.10gb | [4,6) mig-workload 2g.10gb | [6,8) free") {
		t.Errorf("occupancy:\n%v", occ)
	}
	t.Logf("occupancy:\n%s\n%s", occ[0], occ[1])

	// A plain delete (grace period 30 s): the kubelet stops its containers (the fake runtime
	// at once) and removes the pod, and the device plugin reclaims its instances.
	if err := client.CoreV1().Pods("default").Delete(ctx, "gpu-pod1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "gpu-pod1 gone with its instances", func() (bool, string) {
		_, err := client.CoreV1().Pods("default").Get(ctx, "gpu-pod1", metav1.GetOptions{})
		in := instances()
		return apierrors.IsNotFound(err) && len(in) == 1 && in[0].PodName == "mig-workload", fmt.Sprintf("get: %v; instances %v", err, in)
	})

	// A finished pod's instances are reclaimed too.
	if err := s.FinishPod(ctx, "default", "mig-workload", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "mig-workload's instance reclaimed", func() (bool, string) {
		in := instances()
		return len(in) == 0, fmt.Sprint(in)
	})
	p, err := client.CoreV1().Pods("default").Get(ctx, "mig-workload", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodSucceeded || p.Status.ContainerStatuses[0].State.Terminated == nil {
		t.Errorf("mig-workload status: %+v", p.Status)
	}
	if err := s.FinishPod(ctx, "default", "core-workload", false); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishPod(ctx, "default", "nope", false); !apierrors.IsNotFound(err) {
		t.Errorf("FinishPod of a missing pod: %v", err)
	}

	// A GPU pod that bypassed the scheduler (nodeName at creation, no reservation) gets no
	// instance: PreStartContainer finds nothing signed to realise, says why in a Warning
	// event and marks the pod failed, and the scheduler evicts it.
	bad := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bypass"}, Spec: v1.PodSpec{NodeName: "mig-node", Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}}}
	if _, err := s.CreatePods(ctx, bad); err == nil {
		waitFor(t, 60*time.Second, "the bypassing pod evicted with a Warning event", func() (bool, string) {
			_, err := client.CoreV1().Pods("default").Get(ctx, "bypass", metav1.GetOptions{})
			evs, lerr := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bypass,reason=ReservationNotRealisable"})
			if lerr != nil {
				return false, lerr.Error()
			}
			return apierrors.IsNotFound(err) && len(evs.Items) > 0 && len(instances()) == 0, fmt.Sprintf("get: %v; events %d; instances %v", err, len(evs.Items), instances())
		})
	} else {
		t.Logf("admission refused the bypassing pod: %v", err)
	}

	s.Stop()
	stopped = true
	s.Stop() // idempotent
	for _, f := range files {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", f, err)
		}
	}
	// Goroutines: what remains after Stop is the API server libraries' own: healthz's
	// process-wide log check (wait.Forever) and the audit log's lumberjack mill goroutine,
	// which lumberjack never ends. A leak of any sandbox component would be dozens.
	var now int
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		now = runtime.NumGoroutine()
		return now <= goroutinesBefore+goroutineSlack, nil
	})
	if now > goroutinesBefore+goroutineSlack {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before Start, %d after Stop (slack %d):\n%s", goroutinesBefore, now, goroutineSlack, buf[:runtime.Stack(buf, true)])
	}
	t.Logf("goroutines: %d before Start, %d after Stop", goroutinesBefore, now)
}

const goroutineSlack = 4

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting %s for %s: %v; last: %s", timeout, what, err, last)
	}
}

func TestStartBadConfig(t *testing.T) {
	_, err := Start(context.Background(), Options{Config: sandboxconfig.Config{Nodes: []sandboxconfig.NodeConfig{{Name: "x", Mode: "mig", GPUs: []string{"V100"}}}}, Install: installFile})
	if err == nil || !strings.Contains(err.Error(), "nodes[0].gpus[0]") {
		t.Errorf("unknown model: %v", err)
	}
	_, err = Start(context.Background(), Options{Config: sandboxconfig.DefaultConfig(), Install: "no/such/file.yaml"})
	if err == nil || !strings.Contains(err.Error(), "no/such/file.yaml") {
		t.Errorf("missing install manifest: %v", err)
	}
}

// TestSandboxCustomWorld runs two mig nodes with a user device config whose allowlist
// leaves the A100 only 3g.20gb and 7g.40gb: the scheduler and the device plugins both use
// it.
func TestSandboxCustomWorld(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "device-config.yaml")
	if err := os.WriteFile(dev, []byte(`nvidia:
  migProfileAllowlist:
  - models: ["A100-PCIE-40GB"]
    profiles: ["3g.20gb", "7g.40gb"]
  - models: ["A30"]
    profiles: ["1g.6gb", "2g.12gb", "4g.24gb"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := sandboxconfig.Config{DeviceConfig: dev, Nodes: []sandboxconfig.NodeConfig{
		{Name: "a30", Mode: api.ModeMIG, GPUs: []string{"A30-24GB"}},
		{Name: "a100", Mode: api.ModeMIG, GPUs: []string{"NVIDIA A100-PCIE-40GB"}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{Config: cfg, Install: installFile})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	node, err := s.Client().CoreV1().Nodes().Get(ctx, "a30", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Allocatable[api.ResourceCount]; q.Value() != 4 { // A30: four 1g.6gb at most
		t.Errorf("a30 allocatable %s", q.String())
	}
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "big", Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG, api.UseGPUTypeAnnotation: "A100"}},
		Spec: v1.PodSpec{SchedulerName: "dynamig-scheduler", Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse("8000")}}}}}}
	if _, err := s.CreatePods(ctx, p); err != nil {
		t.Fatal(err)
	}
	running, err := s.WaitRunning(ctx, time.Minute, "default", "big")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := api.DecodeMigReservations(running[0].Annotations[api.MigReservationsAnnotation])
	if err != nil || len(recs) != 1 || recs[0].Profile != "3g.20gb" || running[0].Spec.NodeName != "a100" {
		t.Fatalf("big on %s: %+v, %v", running[0].Spec.NodeName, recs, err)
	}
	in, err := s.Instances("a100")
	if err != nil || len(in) != 1 || in[0].Profile != "3g.20gb" || in[0].PodName != "big" {
		t.Errorf("a100 instances: %v, %v", in, err)
	}
	if in, err := s.Instances("a30"); err != nil || len(in) != 0 {
		t.Errorf("a30 instances: %v, %v", in, err)
	}
}
