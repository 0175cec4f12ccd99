package realcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/probe/report"
)

func TestMain(m *testing.M) { Main(m) }

// TestChart installs the chart with Helm's SDK into a cluster of two GPU nodes on containerd
// 2.x and runc and one on containerd 1.7 with CDI off, then checks from inside the
// containers.
func TestChart(t *testing.T) {
	start := time.Now()
	c := Start(t, Options{Nodes: []string{"n1", "n2"}, CDIOffNodes: []string{"cdi-off"}})
	t.Logf("cluster up, dynamig installed and ready in %s", time.Since(start).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("components run as pods", func(t *testing.T) {
		for _, tc := range []struct {
			prefix, serviceAccount, image string
			want                          int
		}{
			{"dynamig-scheduler-", "dynamig-scheduler", "dynamig-scheduler", 1},
			{"dynamig-webhook-", "dynamig-webhook", "dynamig-webhook", 1},
			{"dynamig-device-plugin-", "dynamig-device-plugin", "dynamig-device-plugin", len(c.Nodes)},
		} {
			pods, err := c.Pods(ctx, tc.prefix)
			if err != nil {
				t.Fatal(err)
			}
			if len(pods) != tc.want {
				t.Errorf("%s*: %d pods, want %d", tc.prefix, len(pods), tc.want)
			}
			for _, p := range pods {
				if p.Status.Phase != v1.PodRunning || !ready(&p) {
					t.Errorf("pod %s: %s, not Ready", p.Name, p.Status.Phase)
				}
				if p.Spec.ServiceAccountName != tc.serviceAccount {
					t.Errorf("pod %s runs as service account %q, want %q", p.Name, p.Spec.ServiceAccountName, tc.serviceAccount)
				}
				if img := p.Spec.Containers[0].Image; !strings.HasPrefix(img, Registry+"/dynamig/"+tc.image+":") {
					t.Errorf("pod %s runs image %s", p.Name, img)
				}
				for _, cs := range p.Status.ContainerStatuses {
					if cs.RestartCount != 0 {
						t.Errorf("pod %s: container %s restarted %d times", p.Name, cs.Name, cs.RestartCount)
					}
				}
			}
		}
	})

	t.Run("seed example, seen from inside", func(t *testing.T) {
		raw, err := os.ReadFile("../../examples/gpu-pod1.yaml")
		if err != nil {
			t.Fatal(err)
		}
		pods, err := cluster.DecodePods(raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			p.Namespace = metav1.NamespaceDefault
			if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range pods {
			c.seesOwnDevices(t, ctx, p.Namespace, p.Name)
		}
	})

	t.Run("a Job's pod completes and its instance is reclaimed", func(t *testing.T) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "one-shot", Namespace: metav1.NamespaceDefault},
			Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template: v1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
					Spec: v1.PodSpec{
						RestartPolicy: v1.RestartPolicyNever,
						Containers: []v1.Container{{Name: "work", Image: kubeletnode.ProbeImage, Args: []string{"--exit=0"},
							ImagePullPolicy: v1.PullNever,
							Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
								"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("4000")}}}},
					},
				},
			},
		}
		if _, err := c.Client.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			j, err := c.Client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
			return err == nil && j.Status.Succeeded == 1, nil
		})
		if err != nil {
			t.Fatalf("the Job did not complete: %v\n%s", err, c.Describe(ctx))
		}
		pods, err := c.Client.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job.Name})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("the Job's pods: %v, %v", pods, err)
		}
		pod := pods.Items[0]
		recs, err := api.DecodeMigReservations(pod.Annotations[api.MigReservationsAnnotation])
		if err != nil || len(recs) != 1 || !recs[0].Realized() {
			t.Fatalf("the Job's pod's reservation: %v, %v", recs, err)
		}
		got, err := c.Nodes[pod.Spec.NodeName].ProbeReport(&pod, "work")
		if err != nil {
			t.Fatal(err)
		}
		if got.Env["NVIDIA_VISIBLE_DEVICES"] != recs[0].MigUUID {
			t.Errorf("the Job's container saw NVIDIA_VISIBLE_DEVICES=%q, want %s", got.Env["NVIDIA_VISIBLE_DEVICES"], recs[0].MigUUID)
		}
		c.noInstanceOf(t, ctx, &pod, recs[0].MigUUID)
	})

	t.Run("a pod deleted while it runs leaves no instance and no CDI spec", func(t *testing.T) {
		raw, err := os.ReadFile("../../examples/mig-workload.yaml")
		if err != nil {
			t.Fatal(err)
		}
		pods, err := cluster.DecodePods(raw)
		if err != nil || len(pods) != 1 {
			t.Fatalf("examples/mig-workload.yaml: %v, %v", pods, err)
		}
		p := pods[0]
		p.Namespace = metav1.NamespaceDefault
		if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.seesOwnDevices(t, ctx, p.Namespace, p.Name)
		running, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		recs, _ := api.DecodeMigReservations(running.Annotations[api.MigReservationsAnnotation])
		if err := c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("the pod was not deleted: %v", err)
		}
		c.noInstanceOf(t, ctx, running, recs[0].MigUUID)
	})

	t.Run("a node whose runtime ignores CDI: no GPU rather than all, and a warning", func(t *testing.T) {
		// CUDA's image says NVIDIA_VISIBLE_DEVICES=all; where the runtime applies CDI the
		// spec's value replaces it, where it ignores CDI Allocate's void must.
		for _, node := range []string{"n1", "cdi-off"} {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cuda-" + node, Namespace: metav1.NamespaceDefault,
				Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
				Spec: v1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": node},
					Tolerations: []v1.Toleration{{Key: CDIOffTaint.Key, Operator: v1.TolerationOpExists, Effect: CDIOffTaint.Effect}},
					Containers: []v1.Container{{Name: "main", Image: CUDAImage, ImagePullPolicy: v1.PullNever,
						Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
							"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("4000")}}}}}}
			if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		c.seesOwnDevices(t, ctx, metav1.NamespaceDefault, "cuda-n1")

		// The reservation still holds its instance: what the warning tells the user to fix.
		off, recs := c.runningRealised(t, ctx, metav1.NamespaceDefault, "cuda-cdi-off")
		if len(recs) != 1 {
			t.Errorf("cuda-cdi-off's reservations: %v, want one", recs)
		}
		got := c.probeReport(t, ctx, off, "main")
		if v := got.Env["NVIDIA_VISIBLE_DEVICES"]; v != "void" || len(got.Devices) != 0 {
			t.Errorf("on containerd 1.7 with CDI off, cuda-cdi-off sees NVIDIA_VISIBLE_DEVICES=%q and devices %v, want void and none", v, got.Devices)
		}

		var seen []string
		err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			evs, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=CDINotApplied"})
			if err != nil {
				return false, nil
			}
			seen = nil
			var pod, node bool
			for _, e := range evs.Items {
				o := e.InvolvedObject
				seen = append(seen, fmt.Sprintf("%s %s/%s: %s", e.Type, o.Kind, o.Name, e.Message))
				ok := e.Type == v1.EventTypeWarning && strings.Contains(e.Message, "containerd v1.7.35") && strings.Contains(e.Message, "enable_cdi = false")
				pod = pod || ok && o.Kind == "Pod" && o.Name == "cuda-cdi-off"
				node = node || ok && o.Kind == "Node" && o.Name == "cdi-off"
				if o.Name != "cuda-cdi-off" && o.Name != "cdi-off" {
					return false, fmt.Errorf("a CDINotApplied where the runtime applies CDI: %s", strings.Join(seen, "; "))
				}
			}
			return pod && node, nil
		})
		if err != nil {
			t.Fatalf("Warning CDINotApplied on pod cuda-cdi-off and Node cdi-off: %v; events: %v", err, seen)
		}
		for node, want := range map[string]string{"n1": "applies (containerd v2.", "cdi-off": "ignores (containerd v1.7.35)"} {
			url, err := c.DevicePluginMetrics(ctx, node)
			if err != nil {
				t.Fatal(err)
			}
			families, err := cluster.Scrape(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			var states []string
			for _, m := range families["dynamig_device_plugin_runtime_cdi"].GetMetric() {
				l := cluster.Labels(m)
				states = append(states, l["state"]+" ("+l["runtime"]+")")
			}
			if len(states) != 1 || !strings.HasPrefix(states[0], want) {
				t.Errorf("%s: dynamig_device_plugin_runtime_cdi says %v, want %s", node, states, want)
			}
		}
	})

	t.Run("a device plugin pod deleted comes back and adopts the running instances", func(t *testing.T) {
		seed, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "gpu-pod1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node := seed.Spec.NodeName
		before, err := c.Instances(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(before, func(in cluster.Instance) bool { return in.PodName == "gpu-pod1" }) {
			t.Fatalf("no instance of gpu-pod1 on %s to adopt: %v", node, before)
		}
		old, err := c.DevicePluginPod(ctx, node)
		if err != nil || old == nil {
			t.Fatalf("the device plugin pod on %s: %v, %v", node, old, err)
		}
		if err := c.Client.CoreV1().Pods(Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var fresh *v1.Pod
		err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := c.DevicePluginPod(ctx, node)
			if err != nil || p == nil || p.UID == old.UID || !ready(p) {
				return false, nil
			}
			fresh = p
			return true, nil
		})
		if err != nil {
			t.Fatalf("the DaemonSet made no Ready device plugin pod on %s again: %v\n%s", node, err, c.Describe(ctx))
		}
		// Ready is the plugin's /readyz, on its metrics listener: the metrics are served.
		after, err := c.Instances(ctx, node)
		if err != nil {
			t.Fatalf("the new device plugin pod %s serves no metrics: %v\n%s", fresh.Name, err, c.Describe(ctx))
		}
		if !slices.Equal(after, before) {
			t.Errorf("instances on %s before the plugin pod was deleted:\n%v\nafter its new pod %s started:\n%v", node, before, fresh.Name, after)
		}
		now, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "gpu-pod1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if now.Status.Phase != v1.PodRunning || now.Status.ContainerStatuses[0].RestartCount != 0 ||
			now.Annotations[api.MigReservationsAnnotation] != seed.Annotations[api.MigReservationsAnnotation] {
			t.Errorf("gpu-pod1 changed: %s, restarts %d, reservations %s → %s", now.Status.Phase,
				now.Status.ContainerStatuses[0].RestartCount, seed.Annotations[api.MigReservationsAnnotation], now.Annotations[api.MigReservationsAnnotation])
		}
		// The new plugin serves: a pod placed on the node now gets its instance.
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
			Spec: v1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": node},
				Containers: []v1.Container{{Name: "work", Image: kubeletnode.ProbeImage, ImagePullPolicy: v1.PullNever,
					Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
						"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("4000")}}}}}}
		if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.seesOwnDevices(t, ctx, p.Namespace, p.Name)
	})
}

// noInstanceOf waits until the device plugin of p's node reports no MIG instance made for
// p and no CDI spec on the node names migUUID.
func (c *Cluster) noInstanceOf(t *testing.T, ctx context.Context, p *v1.Pod, migUUID string) {
	t.Helper()
	node := p.Spec.NodeName
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		ins, err := c.Instances(ctx, node)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, in := range ins {
			if in.PodNamespace == p.Namespace && in.PodName == p.Name {
				last = "instance " + in.String()
				return false, nil
			}
		}
		specs, err := os.ReadDir(c.Nodes[node].CDIDir)
		if err != nil {
			return false, err
		}
		for _, f := range specs {
			raw, err := os.ReadFile(filepath.Join(c.Nodes[node].CDIDir, f.Name()))
			if err == nil && strings.Contains(string(raw), migUUID) {
				last = "CDI spec " + f.Name() + " names " + migUUID
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s ended, but its instance or spec stays: %s", p.Namespace, p.Name, last)
	}
}

func ready(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// seesOwnDevices waits until the pod runs with its MIG reservations realised, then checks
// that each container's own program reports exactly the MIG UUIDs of its reservations in
// NVIDIA_VISIBLE_DEVICES, and nothing else of a GPU.
func (c *Cluster) seesOwnDevices(t *testing.T, ctx context.Context, namespace, name string) {
	t.Helper()
	pod, recs := c.runningRealised(t, ctx, namespace, name)
	for i, ctr := range pod.Spec.Containers {
		var want []string
		for _, r := range recs {
			if r.ContainerIndex == len(pod.Spec.InitContainers)+i {
				want = append(want, r.MigUUID)
			}
		}
		got := c.probeReport(t, ctx, pod, ctr.Name)
		seen := strings.Split(got.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		slices.Sort(seen)
		slices.Sort(want)
		if !slices.Equal(seen, want) {
			t.Errorf("pod %s container %s sees NVIDIA_VISIBLE_DEVICES=%q, want its reservations' %v", name, ctr.Name, got.Env["NVIDIA_VISIBLE_DEVICES"], want)
		}
		if len(got.Devices) != 0 {
			t.Errorf("pod %s container %s sees device nodes %v (deviceEdits env gives none)", name, ctr.Name, got.Devices)
		}
		t.Logf("pod %s container %s sees %s", name, ctr.Name, fmt.Sprint(got.Env))
	}
}

// runningRealised waits until the pod runs with its MIG reservations realised, and returns it
// and them.
func (c *Cluster) runningRealised(t *testing.T, ctx context.Context, namespace, name string) (*v1.Pod, []api.MigReservation) {
	t.Helper()
	var pod *v1.Pod
	var recs []api.MigReservation
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		if p.Status.Phase != v1.PodRunning {
			return false, nil
		}
		recs, err = api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil || len(recs) == 0 {
			return false, nil
		}
		for _, r := range recs {
			if !r.Realized() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s did not run with realised reservations: %v\n%s", namespace, name, err, c.Describe(ctx))
	}
	return pod, recs
}

// probeReport waits for the report the probe prints in container of pod.
func (c *Cluster) probeReport(t *testing.T, ctx context.Context, pod *v1.Pod, container string) report.Report {
	t.Helper()
	var got report.Report
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		got, err = c.Nodes[pod.Spec.NodeName].ProbeReport(pod, container)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("pod %s container %s: no report: %v", pod.Name, container, err)
	}
	return got
}
