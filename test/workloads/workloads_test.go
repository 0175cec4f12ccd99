// Package workloads tests GPU pods made the way users make them, by kube-controller-manager's
// controllers on the sandbox (sandbox.Options.Controllers): a Deployment scaled, a node
// drained and uncordoned, a Job run to completion. Its own package, so that only this suite
// and the sandbox command link kube-controller-manager (test/cluster/controllermanager).
package workloads

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster/controllermanager"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	"github.com/dynamig/dynamig/test/sandbox/sandboxtest"
)

// kubectl is the real kubectl, built from the pinned modules (cmd/kubectl) for the drain: its
// drain library cannot be linked here (through kustomize it imports Go's plugin package, and a
// binary that does is bound at load time, which go-nvml's deliberately unresolved NVML symbols,
// linked through the device plugin, cannot be).
var kubectl string

func TestMain(m *testing.M) {
	sandboxtest.Main(m, map[string]*string{"github.com/dynamig/dynamig/cmd/kubectl": &kubectl})
}

// kubectlRun runs kubectl against the sandbox, failing the test with its output.
func (w *world) kubectlRun(args ...string) {
	w.T.Helper()
	ctx, cancel := context.WithTimeout(w.Ctx, 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", w.SB.Kubeconfig()}, args...)...).CombinedOutput()
	if err != nil {
		w.T.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// world is a sandbox with kube-controller-manager: two nodes of one A100-40GB each.
type world struct{ sandboxtest.World }

const a100 = "A100-40GB"

func start(t *testing.T) *world {
	t.Helper()
	nodes := []sandboxconfig.NodeConfig{
		{Name: "n1", Mode: api.ModeMIG, GPUs: []string{a100}},
		{Name: "n2", Mode: api.ModeMIG, GPUs: []string{a100}},
	}
	return &world{sandboxtest.Start(t, sandbox.Options{Config: sandboxconfig.Config{Nodes: nodes},
		Install: "../../manifests/install.yaml", Controllers: controllermanager.Start}, 3*time.Minute)}
}

// deploy creates a Deployment of replicas pods of sandbox.MIGPodTemplate(app, memory).
func (w *world) deploy(app string, replicas int32, memory int) {
	w.T.Helper()
	if _, err := w.C.AppsV1().Deployments("default").Create(w.Ctx, sandbox.MIGDeployment("default", app, replicas, memory), metav1.CreateOptions{}); err != nil {
		w.T.Fatal(err)
	}
}

// instances counts the MIG instances on node.
func (w *world) instances(node string) (int, error) {
	ins, err := w.SB.Instances(node)
	return len(ins), err
}

// settle waits until exactly want of the app's pods run realised, no other pod of it
// exists, and its instances are exactly theirs (sandbox.WaitReplicas).
func (w *world) settle(app string, want int, timeout time.Duration) []v1.Pod {
	w.T.Helper()
	ready, err := w.SB.WaitReplicas(w.Ctx, timeout, "default", "app="+app, want)
	if err != nil {
		w.dump()
		w.T.Fatal(err)
	}
	return ready
}

func TestWorkloads(t *testing.T) {
	w := start(t)

	// A Deployment of one-slice pods scaled 6 → 2 → 9: each time exactly that many replicas
	// run on realised instances, and exactly that many instances exist.
	t.Run("Deployment scaled 6, 2, 9", func(t *testing.T) {
		w := &world{w.For(t)}
		deploys := w.C.AppsV1().Deployments("default")
		w.deploy("infer", 6, 4000)
		for _, replicas := range []int32{6, 2, 9} {
			if replicas != 6 {
				scale, err := deploys.GetScale(w.Ctx, "infer", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				scale.Spec.Replicas = replicas
				if _, err := deploys.UpdateScale(w.Ctx, "infer", scale, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			w.settle("infer", int(replicas), 2*time.Minute)
		}
		if err := deploys.Delete(w.Ctx, "infer", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
			t.Fatal(err)
		}
		w.settle("infer", 0, 2*time.Minute)
	})

	// kubectl drain of a GPU node evicts its replicas, whose instances are reclaimed, and
	// leaves its device plugin (a DaemonSet's pod); the other node is full, so the
	// replacements wait, and after uncordon they run on the drained node again. n2: n1 holds
	// the sandbox's scheduler and webhook pods, which no controller owns (drain would want
	// --force).
	t.Run("drain and uncordon", func(t *testing.T) {
		w := &world{w.For(t)}
		deploys := w.C.AppsV1().Deployments("default")
		// Three 2g.10gb per A100-40GB: six fill both nodes.
		w.deploy("train", 6, 9000)
		w.settle("train", 6, 2*time.Minute)

		w.kubectlRun("drain", "n2", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2m")
		w.WaitFor("n2's instances reclaimed and its replicas' replacements pending", 2*time.Minute, func() (bool, string) {
			n, err := w.instances("n2")
			if err != nil || n != 0 {
				return false, fmt.Sprintf("%d instances on n2 (%v)", n, err)
			}
			phases := map[v1.PodPhase]int{}
			for _, p := range w.mustList("train") {
				if p.DeletionTimestamp == nil {
					phases[p.Status.Phase]++
				}
			}
			return phases[v1.PodRunning] == 3 && phases[v1.PodPending] == 3, fmt.Sprintf("pods by phase: %v", phases)
		})
		for _, p := range w.mustList("train") {
			if p.DeletionTimestamp == nil && p.Spec.NodeName == "n2" {
				t.Errorf("%s bound to the cordoned n2", p.Name)
			}
		}

		w.kubectlRun("uncordon", "n2")
		onN2 := 0
		for _, p := range w.settle("train", 6, 2*time.Minute) {
			if p.Spec.NodeName == "n2" {
				onN2++
			}
		}
		if onN2 != 3 {
			t.Errorf("%d replicas on n2 after uncordon, want 3", onN2)
		}
		if err := deploys.Delete(w.Ctx, "train", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
			t.Fatal(err)
		}
		w.settle("train", 0, 2*time.Minute)
	})

	// A Job's pod runs on its instance, its process exits 0, the Job completes and the
	// instance is reclaimed.
	t.Run("Job", func(t *testing.T) {
		w := &world{w.For(t)}
		tmpl := sandbox.MIGPodTemplate("batch", 4000)
		tmpl.Spec.RestartPolicy = v1.RestartPolicyNever
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "batch"}, Spec: batchv1.JobSpec{Template: tmpl, BackoffLimit: ptr.To[int32](0)}}
		if _, err := w.C.BatchV1().Jobs("default").Create(w.Ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := w.settle("batch", 1, 2*time.Minute)[0]
		if err := w.SB.FinishPod(w.Ctx, "default", p.Name, true); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the Job complete and its instance reclaimed", 2*time.Minute, func() (bool, string) {
			j, err := w.C.BatchV1().Jobs("default").Get(w.Ctx, "batch", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			n1, err1 := w.instances("n1")
			n2, err2 := w.instances("n2")
			return j.Status.Succeeded == 1 && err1 == nil && err2 == nil && n1+n2 == 0,
				fmt.Sprintf("succeeded %d, %d instances (%v, %v)", j.Status.Succeeded, n1+n2, err1, err2)
		})
	})

	if err := w.SB.WaitInvariants(w.Ctx, time.Minute, nil); err != nil {
		t.Error(err)
	}
}

// list lists the app's pods.
func (w *world) list(app string) ([]v1.Pod, error) {
	pods, err := w.C.CoreV1().Pods("default").List(w.Ctx, metav1.ListOptions{LabelSelector: labels.Set{"app": app}.String()})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func (w *world) mustList(app string) []v1.Pod {
	w.T.Helper()
	pods, err := w.list(app)
	if err != nil {
		w.T.Fatal(err)
	}
	return pods
}

// dump logs the namespace's events and the workloads' status, for a failure.
func (w *world) dump() {
	for _, ns := range []string{"default", "kube-system"} {
		evs, err := w.C.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			w.T.Log(err)
			continue
		}
		for _, e := range evs.Items {
			w.T.Logf("event %s %s/%s %s: %s", ns, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	if rss, err := w.C.AppsV1().ReplicaSets("default").List(context.Background(), metav1.ListOptions{}); err == nil {
		for _, rs := range rss.Items {
			w.T.Logf("replicaset %s: %+v", rs.Name, rs.Status)
		}
	}
	if ds, err := w.C.AppsV1().Deployments("default").List(context.Background(), metav1.ListOptions{}); err == nil {
		for _, d := range ds.Items {
			w.T.Logf("deployment %s: %+v", d.Name, d.Status)
		}
	}
}
