// Package faults is the fault suite: each fault of docs/reliability.md injected into the
// sandbox cluster (the real kube-apiserver, dynamig-scheduler and kubelet, the real device
// plugin on simulated GPUs), then the invariants checked once the cluster has caught up:
// no two live pods' reservations overlap, every running container's MIG instance exists and
// is the one its CDI spec gave it, every instance belongs to a live pod, and nothing busy
// was destroyed.
package faults

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	"github.com/dynamig/dynamig/test/sandbox/sandboxtest"
)

const install = "../../manifests/install.yaml"

func TestMain(m *testing.M) {
	flag.Parse()
	cluster.QuietLogs(testing.Verbose())
	os.Exit(m.Run())
}

// world is a running sandbox and the test using it.
type world struct{ sandboxtest.World }

func start(t *testing.T, nodes ...sandboxconfig.NodeConfig) *world {
	t.Helper()
	return &world{sandboxtest.Start(t, sandbox.Options{Config: sandboxconfig.Config{Nodes: nodes}, Install: install}, 3*time.Minute)}
}

func mig(name string, gpus ...string) sandboxconfig.NodeConfig {
	return sandboxconfig.NodeConfig{Name: name, Mode: api.ModeMIG, GPUs: gpus}
}

// pod is a one-device MIG pod of memory MiB for node.
func pod(name, node string, memory int) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
		Spec: v1.PodSpec{SchedulerName: "dynamig-scheduler", NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04", Command: []string{"sleep", "infinity"},
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
					api.ResourceCount:  *resource.NewQuantity(1, resource.DecimalSI),
					api.ResourceMemory: *resource.NewQuantity(int64(memory), resource.DecimalSI)}}}}}}
}

// running waits until the pod runs with its reservation realised and returns the
// reservation.
func (w *world) running(name string, timeout time.Duration) api.MigReservation {
	w.T.Helper()
	var out api.MigReservation
	w.WaitFor(name+" running", timeout, func() (bool, string) {
		p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase != v1.PodRunning {
			devices := ""
			if node := p.Spec.NodeSelector[v1.LabelHostname]; node != "" && p.Spec.NodeName == "" {
				if n, err := w.C.CoreV1().Nodes().Get(w.Ctx, node, metav1.GetOptions{}); err == nil {
					q := n.Status.Allocatable[api.ResourceCount]
					devices = fmt.Sprintf(" (%s allocatable %s: %s)", node, api.ResourceCount, q.String())
				}
			}
			return false, fmt.Sprintf("%s is %s: %s%s", name, p.Status.Phase, w.LastEvent(p), devices)
		}
		recs, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil || len(recs) != 1 || !recs[0].Realized() {
			return false, fmt.Sprintf("reservation %v (%v)", recs, err)
		}
		out = recs[0]
		return true, ""
	})
	return out
}

// event waits for an event of that reason on the pod whose message contains what.
func (w *world) event(name, reason, what string) {
	w.T.Helper()
	w.WaitFor(fmt.Sprintf("a %s event on %s saying %q", reason, name, what), 60*time.Second, func() (bool, string) {
		evs, err := w.C.CoreV1().Events("default").List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == reason && strings.Contains(e.Message, what) {
				return true, ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, strings.Join(seen, "\n")
	})
}

// settled waits for every invariant to hold; foreign instances are no leak.
func (w *world) settled(foreign ...string) {
	w.T.Helper()
	f := map[string]bool{}
	for _, u := range foreign {
		f[u] = true
	}
	if err := w.SB.WaitInvariants(w.Ctx, 90*time.Second, f); err != nil {
		w.T.Fatal(err)
	}
}

// done deletes the pods, waits until they are gone and the invariants hold.
func (w *world) done(names ...string) {
	w.T.Helper()
	for _, n := range names {
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, n, metav1.DeleteOptions{}); err != nil {
			w.T.Fatal(err)
		}
	}
	w.WaitFor("pods gone", 60*time.Second, func() (bool, string) {
		for _, n := range names {
			if _, err := w.C.CoreV1().Pods("default").Get(w.Ctx, n, metav1.GetOptions{}); err == nil {
				return false, n + " still exists"
			}
		}
		return true, ""
	})
	w.settled()
}

// instance is the MIG instance with that UUID on node, if NVML has it.
func (w *world) instance(node, migUUID string) (sim.ComputeInstanceState, bool) {
	for _, g := range w.SB.GPUs(node).Snapshot() {
		for _, gi := range g.GpuInstances {
			for _, ci := range gi.ComputeInstances {
				if ci.MigUUID == migUUID {
					return ci, true
				}
			}
		}
	}
	return sim.ComputeInstanceState{}, false
}

// gpuInstances counts node's GPU instances, whole or half made.
func (w *world) gpuInstances(node string) int {
	n := 0
	for _, g := range w.SB.GPUs(node).Snapshot() {
		n += len(g.GpuInstances)
	}
	return n
}

// TestFaults injects each fault into one sandbox, a node per group of faults, and checks
// the invariants after each.
func TestFaults(t *testing.T) {
	const a100 = "A100-40GB"
	w := start(t, mig("create", a100), mig("kill", a100), mig("api", a100), mig("reclaim", a100),
		mig("bus", a100, a100), mig("gone", a100), mig("reboot", a100))

	// NVML refuses the GPU-instance create, then the compute-instance create after its GPU
	// instance was made: PreStartContainer fails with the NVML error (a Warning event says
	// so), the half-made GPU instance is rolled back, and the kubelet's retry realises it.
	for _, op := range []sim.Op{sim.OpCreateGpuInstance, sim.OpCreateComputeInstance} {
		t.Run(op.String()+" fails", func(t *testing.T) {
			w := &world{w.For(t)}
			name := strings.ToLower(op.String())
			w.SB.GPUs("create").FailNext(0, op, nvml.ErrorInsufficientRes)
			w.Create(pod(name, "create", 9000))
			w.event(name, "RealisationFailed", "injected fault")
			w.running(name, 90*time.Second)
			if n := w.gpuInstances("create"); n != 1 {
				t.Errorf("%d GPU instances on the node, want the pod's one", n)
			}
			w.settled()
			w.done(name)
		})
	}

	// The device plugin is killed between the GPU-instance create and the compute-instance
	// create: the next plugin finds the intent in its checkpoint, clears the half-made GPU
	// instance, and the kubelet's retry realises the pod.
	t.Run("device plugin killed between GI and CI create", func(t *testing.T) {
		w := &world{w.For(t)}
		hold := w.SB.GPUs("kill").HoldNext(0, sim.OpCreateComputeInstance)
		w.Create(pod("k1", "kill", 9000))
		waitHeld(t, hold)
		if err := w.SB.KillDevicePlugin(w.Ctx, "kill"); err != nil {
			t.Fatal(err)
		}
		hold.Abandon()
		if n := w.gpuInstances("kill"); n != 1 {
			t.Fatalf("%d GPU instances after the kill, want the half-made one", n)
		}
		if err := w.SB.StartDevicePlugin(w.Ctx, "kill"); err != nil {
			t.Fatal(err)
		}
		w.running("k1", 90*time.Second)
		w.settled()
		w.done("k1")
	})

	// Killed right after the instance was made, before the checkpoint records it as made
	// and before the write-back: the next plugin finds the intent and an instance at its
	// placement, redoes the create, and the pod runs on exactly one instance.
	t.Run("device plugin killed between create and write-back", func(t *testing.T) {
		w := &world{w.For(t)}
		killed := make(chan error, 1)
		w.SB.GPUs("kill").AfterNext(0, sim.OpCreateComputeInstance, func() {
			killed <- w.SB.KillDevicePlugin(w.Ctx, "kill")
			runtime.Goexit()
		})
		w.Create(pod("k2", "kill", 9000))
		select {
		case err := <-killed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the pod's instance was never created")
		}
		if err := w.SB.StartDevicePlugin(w.Ctx, "kill"); err != nil {
			t.Fatal(err)
		}
		w.running("k2", 90*time.Second)
		if n := w.gpuInstances("kill"); n != 1 {
			t.Errorf("%d GPU instances, want the pod's one", n)
		}
		w.settled()
		w.done("k2")
	})

	// The write-back is lost (the API server unreachable just after the create), then the
	// plugin restarts: the instance recorded in the checkpoint is adopted, not made twice.
	t.Run("write-back lost and device plugin restarted", func(t *testing.T) {
		w := &world{w.For(t)}
		created := make(chan struct{})
		t.Cleanup(func() { _ = w.SB.CutAPI("kill", false) })
		w.SB.GPUs("kill").AfterNext(0, sim.OpCreateComputeInstance, func() {
			_ = w.SB.CutAPI("kill", true)
			close(created)
		})
		w.Create(pod("k3", "kill", 9000))
		<-created
		time.Sleep(5 * time.Second) // the write-back fails; no event can say so
		first, _ := lastMIG(w.SB.GPUs("kill"))
		if err := w.SB.KillDevicePlugin(w.Ctx, "kill"); err != nil {
			t.Fatal(err)
		}
		_ = w.SB.CutAPI("kill", false)
		if err := w.SB.StartDevicePlugin(w.Ctx, "kill"); err != nil {
			t.Fatal(err)
		}
		r := w.running("k3", 90*time.Second)
		if r.MigUUID != first {
			t.Errorf("the pod runs on %s, not the instance made before the restart (%s)", r.MigUUID, first)
		}
		w.settled()
		w.done("k3")
	})

	// PreStartContainer outlives the kubelet's 30 s deadline (the create hangs): the create
	// completes after the kubelet gave up, and the kubelet's retry adopts that instance.
	t.Run("PreStart deadline exceeded", func(t *testing.T) {
		w := &world{w.For(t)}
		hold := w.SB.GPUs("create").HoldNext(0, sim.OpCreateGpuInstance)
		w.Create(pod("slow", "create", 9000))
		waitHeld(t, hold)
		time.Sleep(32 * time.Second)
		hold.Release()
		w.running("slow", 90*time.Second)
		if n := w.gpuInstances("create"); n != 1 {
			t.Errorf("%d GPU instances, want the pod's one", n)
		}
		w.settled()
		w.done("slow")
	})

	// The kubelet restarts while a pod's PreStartContainer is creating its instance.
	t.Run("kubelet restart with a pod starting", func(t *testing.T) {
		w := &world{w.For(t)}
		hold := w.SB.GPUs("create").HoldNext(0, sim.OpCreateGpuInstance)
		w.Create(pod("kr", "create", 9000))
		waitHeld(t, hold)
		restarted := make(chan error, 1)
		go func() { restarted <- w.SB.RestartKubelet(w.Ctx, "create") }()
		time.Sleep(2 * time.Second)
		hold.Release()
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
		w.running("kr", 90*time.Second)
		w.settled()
		w.done("kr")
	})

	// The API server is unreachable from the node for 30 s while a pod ended (reclaim) and
	// another starts (PreStart): nothing is destroyed on an unreadable API state, PreStart
	// fails until the API is back, then the new pod runs and the ended pod's instance goes.
	t.Run("API server unreachable for 30s", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("old", "api", 9000))
		old := w.running("old", 60*time.Second)
		if err := w.SB.CutAPI("api", true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.SB.CutAPI("api", false) })
		cut := time.Now()
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, "old", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.Create(pod("new", "api", 9000))
		for time.Since(cut) < 30*time.Second {
			if _, ok := w.instance("api", old.MigUUID); !ok {
				t.Fatalf("the ended pod's instance was destroyed %v into the outage: the API could not be read", time.Since(cut).Round(time.Second))
			}
			if p := w.Get("new"); p.Status.Phase == v1.PodRunning {
				t.Fatal("the new pod runs while its node's device plugin cannot read it")
			}
			time.Sleep(time.Second)
		}
		_ = w.SB.CutAPI("api", false)
		w.running("new", 120*time.Second)
		w.settled()
		w.done("new")
	})

	// A process outlives its pod on the instance: destroy returns IN_USE, the instance is
	// kept (never destroyed busy) and published as unexplained, so the scheduler does not
	// hand its placement out; once the process ends, the next reclaim pass takes it.
	t.Run("destroy IN_USE", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("busy", "reclaim", 9000))
		r := w.running("busy", 60*time.Second)
		gpus := w.SB.GPUs("reclaim")
		if err := gpus.AddProcess(r.MigUUID, 4242); err != nil {
			t.Fatal(err)
		}
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, "busy", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the kept instance published as unexplained", 60*time.Second, func() (bool, string) {
			n, err := w.C.CoreV1().Nodes().Get(w.Ctx, "reclaim", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			inv := n.Annotations[api.NodeInventoryAnnotation]
			return strings.Contains(inv, "unexplainedInstances") && strings.Contains(inv, fmt.Sprintf(`"start":%d`, r.Placement.Start)), inv
		})
		if _, ok := w.instance("reclaim", r.MigUUID); !ok {
			t.Fatal("a busy instance was destroyed")
		}
		// The whole GPU is asked for: its placement overlaps the kept instance.
		w.Create(pod("whole", "reclaim", 40000))
		w.WaitFor("the whole-GPU pod refused while the instance is kept", 30*time.Second, func() (bool, string) {
			p := w.Get("whole")
			return p.Spec.NodeName == "" && scheduledFalse(p), fmt.Sprintf("node %q %v", p.Spec.NodeName, p.Status.Conditions)
		})
		w.settled(r.MigUUID)
		if err := gpus.RemoveProcess(r.MigUUID, 4242); err != nil {
			t.Fatal(err)
		}
		w.running("whole", 120*time.Second)
		w.settled()
		w.done("whole")
	})

	// The pod is deleted while its PreStartContainer creates the instance: the instance is
	// made for a pod that no longer exists, and reclaim destroys it.
	t.Run("pod deleted during PreStart", func(t *testing.T) {
		w := &world{w.For(t)}
		hold := w.SB.GPUs("reclaim").HoldNext(0, sim.OpCreateGpuInstance)
		w.Create(pod("gone", "reclaim", 9000))
		waitHeld(t, hold)
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the pod gone", 60*time.Second, func() (bool, string) {
			_, err := w.C.CoreV1().Pods("default").Get(w.Ctx, "gone", metav1.GetOptions{})
			return err != nil, "still there"
		})
		hold.Release()
		w.settled()
	})

	// A GPU falls off the bus with a pod on it: NVML answers GPU_IS_LOST, the inventory
	// publishes the GPU unhealthy, no new pod is placed on it and nothing of it is destroyed;
	// the pod on it keeps its instance, and the GPU serves again once it is back.
	t.Run("GPU lost with a pod on it", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("on-lost", "bus", 19000))
		r := w.running("on-lost", 60*time.Second)
		gpus := w.SB.GPUs("bus")
		lost := 0
		for _, g := range gpus.Snapshot() {
			if g.UUID == r.GPUUUID {
				lost = g.Index
			}
		}
		gpus.LoseGPU(lost)
		w.WaitFor("the lost GPU published unhealthy", 60*time.Second, func() (bool, string) {
			n, err := w.C.CoreV1().Nodes().Get(w.Ctx, "bus", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			inv, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
			if err != nil {
				return false, err.Error()
			}
			for _, g := range inv {
				if g.ID == r.GPUUUID {
					return !g.Health, fmt.Sprintf("health %v", g.Health)
				}
			}
			return false, "the GPU is not in the inventory"
		})
		w.Create(pod("beside", "bus", 19000), pod("beside2", "bus", 19000))
		for _, name := range []string{"beside", "beside2"} {
			if got := w.running(name, 60*time.Second); got.GPUUUID == r.GPUUUID {
				t.Errorf("%s was placed on the lost GPU", name)
			}
		}
		if _, ok := w.instance("bus", r.MigUUID); !ok {
			t.Error("the lost GPU's instance was destroyed")
		}
		gpus.RecoverGPU(lost)
		w.settled()
		w.done("on-lost", "beside", "beside2")
	})

	// A node's device plugin is gone. First it is cut off from the API server while the
	// kubelet still advertises its devices (a hung plugin): its heartbeat expires and no new
	// pod is sent to the node, a Pending pod saying why. Then it is killed (the kubelet stops
	// advertising the devices). The pod running there keeps running throughout, and a plugin
	// started again takes the Pending pod.
	t.Run("device plugin gone", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("stays", "gone", 9000))
		r := w.running("stays", 60*time.Second)
		if err := w.SB.CutAPI("gone", true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.SB.CutAPI("gone", false) })
		w.WaitFor("the heartbeat to expire", 90*time.Second, func() (bool, string) {
			l, err := w.C.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(w.Ctx, api.HeartbeatLeaseName("gone"), metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			age := time.Since(l.Spec.RenewTime.Time)
			return age > time.Duration(*l.Spec.LeaseDurationSeconds+1)*time.Second, fmt.Sprintf("renewed %v ago", age)
		})
		w.Create(pod("waits", "gone", 9000))
		w.WaitFor("the new pod Pending for the expired heartbeat", 90*time.Second, func() (bool, string) {
			p := w.Get("waits")
			if p.Spec.NodeName != "" {
				t.Fatalf("waits was bound to %s, whose device plugin is gone", p.Spec.NodeName)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodScheduled && strings.Contains(c.Message, "heartbeat") {
					return true, ""
				}
			}
			return false, fmt.Sprint(p.Status.Conditions)
		})
		if err := w.SB.KillDevicePlugin(w.Ctx, "gone"); err != nil {
			t.Fatal(err)
		}
		_ = w.SB.CutAPI("gone", false)
		time.Sleep(5 * time.Second)
		if p := w.Get("waits"); p.Spec.NodeName != "" {
			t.Fatalf("waits was bound to %s, whose device plugin is gone", p.Spec.NodeName)
		}
		if p := w.Get("stays"); p.Status.Phase != v1.PodRunning {
			t.Errorf("the pod on the node is %s", p.Status.Phase)
		}
		if _, ok := w.instance("gone", r.MigUUID); !ok {
			t.Error("the running pod's instance is gone")
		}
		if err := w.SB.StartDevicePlugin(w.Ctx, "gone"); err != nil {
			t.Fatal(err)
		}
		w.running("waits", 30*time.Second) // well before the five-minute flush of unschedulable pods
		w.settled()
		w.done("stays", "waits")
	})

	// The node's clock is 30 s ahead, 30 s behind, then 45 s behind the scheduler's: its
	// heartbeat stays fresh and pods are placed on it.
	t.Run("clock skew", func(t *testing.T) {
		w := &world{w.For(t)}
		for i, skew := range []time.Duration{30 * time.Second, -30 * time.Second, -45 * time.Second} {
			if err := w.SB.SetClockSkew("gone", skew); err != nil {
				t.Fatal(err)
			}
			// Two renewals at the new skew (every 10 s), then a pod.
			time.Sleep(21 * time.Second)
			name := fmt.Sprintf("skew%d", i)
			w.Create(pod(name, "gone", 9000))
			w.running(name, 60*time.Second)
			w.done(name)
		}
		_ = w.SB.SetClockSkew("gone", 0)
	})

	// The node reboots: every instance and CDI spec is lost, the pods stay bound, and their
	// containers come back on instances made again at the reserved placements.
	t.Run("node reboot", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("r1", "reboot", 9000), pod("r2", "reboot", 4000))
		before := map[string]api.MigReservation{"r1": w.running("r1", 60*time.Second), "r2": w.running("r2", 60*time.Second)}
		if err := w.SB.RebootNode(w.Ctx, "reboot"); err != nil {
			t.Fatal(err)
		}
		for name, r := range before {
			w.WaitFor(name+" on a new instance", 90*time.Second, func() (bool, string) {
				recs, err := api.DecodeMigReservations(w.Get(name).Annotations[api.MigReservationsAnnotation])
				if err != nil || len(recs) != 1 {
					return false, fmt.Sprint(recs, err)
				}
				return recs[0].Realized() && recs[0].MigUUID != r.MigUUID, recs[0].MigUUID
			})
			if got := w.running(name, 90*time.Second); got.Placement != r.Placement || got.GPUUUID != r.GPUUUID {
				t.Errorf("%s moved from %s to %s", name, r.Placement, got.Placement)
			}
		}
		w.settled()
		w.done("r1", "r2")
	})

	// The scheduler is restarted while its Bindings are in flight (some sent, their
	// answers lost with it), and the new one places the rest and more: no placement is
	// given twice.
	t.Run("scheduler restart with Bindings in flight", func(t *testing.T) {
		w := &world{w.For(t)}
		var names []string
		for i := 0; i < 6; i++ {
			p := pod(fmt.Sprintf("s%d", i), "reboot", 4000)
			if i%2 == 1 {
				p.Spec.NodeSelector["kubernetes.io/hostname"] = "kill"
			}
			w.Create(p)
			names = append(names, p.Name)
		}
		if err := w.SB.RestartScheduler(w.Ctx); err != nil {
			t.Fatal(err)
		}
		for i := 6; i < 10; i++ {
			p := pod(fmt.Sprintf("s%d", i), "reboot", 4000)
			if i%2 == 1 {
				p.Spec.NodeSelector["kubernetes.io/hostname"] = "kill"
			}
			w.Create(p)
			names = append(names, p.Name)
		}
		for _, n := range names {
			w.running(n, 90*time.Second)
		}
		w.settled()
		w.done(names...)
	})
}

func waitHeld(t *testing.T, h *sim.Hold) {
	t.Helper()
	select {
	case <-h.Reached():
	case <-time.After(60 * time.Second):
		t.Fatal("the held NVML call never came")
	}
}

// lastMIG is the MIG UUID of the newest compute instance on the node's first GPU.
func lastMIG(s *sim.Sim) (string, bool) {
	gpus := s.Snapshot()
	for i := len(gpus[0].GpuInstances) - 1; i >= 0; i-- {
		for _, ci := range gpus[0].GpuInstances[i].ComputeInstances {
			return ci.MigUUID, true
		}
	}
	return "", false
}

func scheduledFalse(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return true
		}
	}
	return false
}
