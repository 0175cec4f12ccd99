package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"k8s.io/apimachinery/pkg/util/wait"
	daemonutil "k8s.io/kubernetes/pkg/controller/daemon/util"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/manifests"
	"github.com/dynamig/dynamig/test/cluster"
)

// DefaultInstall is the shipped plain-manifest install, relative to the repository root.
const DefaultInstall = "manifests/install.yaml"

// The chart's objects the sandbox reads or changes.
const (
	schedulerConfigMap   = "dynamig-scheduler-config"
	deviceConfigMap      = "dynamig-device-config"
	webhookName          = "dynamig-webhook"
	schedulerWorkload    = "dynamig-scheduler"
	devicePluginWorkload = "dynamig-device-plugin"
	// tokenLifetime bounds the sandbox's pod-bound tokens; nothing rotates them.
	tokenLifetime = 48 * time.Hour
)

// install is the manifest as the sandbox applies it.
type install struct {
	objs []*unstructured.Unstructured
	// schedulerConfig is the KubeSchedulerConfiguration of the scheduler's ConfigMap.
	schedulerConfig string
	// schedulerFlags are the scheduler container's kube-scheduler flags the sandbox's
	// in-process scheduler takes too: its feature gates.
	schedulerFlags []string
}

// readInstall reads the manifest at path and makes the sandbox's changes to it: the device
// ConfigMap holds the sandbox's device config (its nodes' modes), the webhook configuration
// calls the in-process webhook at webhookURL (the sandbox has no Service routing), and the
// scheduler's and webhook's Deployments have no replicas.
func readInstall(path string, deviceConfig []byte, webhookURL string) (*install, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := manifests.Objects(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	in := &install{objs: objs}
	if in.schedulerConfig, err = manifests.ConfigMapData(objs, schedulerConfigMap, "config.yaml"); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dev := manifests.Find(objs, "ConfigMap", deviceConfigMap)
	if dev == nil {
		return nil, fmt.Errorf("%s: no ConfigMap %s", path, deviceConfigMap)
	}
	if err := unstructured.SetNestedField(dev.Object, string(deviceConfig), "data", "device-config.yaml"); err != nil {
		return nil, err
	}
	mwc := manifests.Find(objs, "MutatingWebhookConfiguration", webhookName)
	if mwc == nil {
		return nil, fmt.Errorf("%s: no MutatingWebhookConfiguration %s", path, webhookName)
	}
	hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
	for _, h := range hooks {
		h.(map[string]any)["clientConfig"] = map[string]any{"url": webhookURL}
	}
	if err := unstructured.SetNestedSlice(mwc.Object, hooks, "webhooks"); err != nil {
		return nil, err
	}
	// The scheduler and the webhook run in the sandbox's process, as a pod the sandbox makes
	// (identity): their Deployments make none of their own, whose pods would wait for a
	// default scheduler the sandbox does not run.
	for _, name := range []string{schedulerWorkload, webhookName} {
		d := manifests.Find(objs, "Deployment", name)
		if d == nil {
			return nil, fmt.Errorf("%s: no Deployment %s", path, name)
		}
		if err := unstructured.SetNestedField(d.Object, int64(0), "spec", "replicas"); err != nil {
			return nil, err
		}
		if name == schedulerWorkload {
			in.schedulerFlags = featureGateArgs(d)
		}
	}
	return in, nil
}

// featureGateArgs are the --feature-gates arguments of the Deployment's containers.
func featureGateArgs(d *unstructured.Unstructured) []string {
	var out []string
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
		for _, a := range args {
			if strings.HasPrefix(a, "--feature-gates=") {
				out = append(out, a)
			}
		}
	}
	return out
}

// workload returns the Deployment or DaemonSet named name.
func (in *install) workload(kind, name string) (*unstructured.Unstructured, error) {
	if o := manifests.Find(in.objs, kind, name); o != nil {
		return o, nil
	}
	return nil, fmt.Errorf("the install manifest has no %s %s", kind, name)
}

// apply server-side applies every object as the admin, then waits until the admission
// policies refuse what they should: a GPU pod naming another scheduler, which the webhook
// leaves alone (HAMi's opt-out label), tried as a dry run.
func (s *Sandbox) apply(ctx context.Context, in *install) error {
	if err := cluster.Apply(ctx, s.cp.Config, "dynamig-sandbox", in.objs); err != nil {
		return err
	}
	otherScheduler := func(p *v1.Pod) {
		p.Labels = map[string]string{"hami.io/webhook": "ignore"}
		p.Spec.SchedulerName = "another-scheduler"
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceName(s.devCfg.Nvidia.ResourceCountName): resource.MustParse("1")}
	}
	return cluster.AwaitAdmission(ctx, s.admin, "admission-probe", 30*time.Second, otherScheduler, func(_ *v1.Pod, err error) (bool, error) {
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
}

// identity gives a component the identity the chart gives it in a cluster: it creates the
// pod the workload (a Deployment or DaemonSet of the manifest) would run, from its pod
// template, bound to node, with edit applied, and returns a kubeconfig with a token of the
// pod's service account bound to that pod, as the pod's projected token is. The kubelet of
// node runs the pod on its fake runtime; the component itself runs in this process.
func (s *Sandbox) identity(ctx context.Context, workload *unstructured.Unstructured, node string, edit func(*v1.Pod)) (string, error) {
	tmpl, _, err := unstructured.NestedMap(workload.Object, "spec", "template")
	if err != nil {
		return "", err
	}
	var pt v1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &pt); err != nil {
		return "", fmt.Errorf("%s %s: pod template: %w", workload.GetKind(), workload.GetName(), err)
	}
	pod := &v1.Pod{ObjectMeta: pt.ObjectMeta, Spec: pt.Spec}
	pod.Name = workload.GetName() + "-" + node
	pod.Namespace = workload.GetNamespace()
	pod.Spec.NodeName = node
	if edit != nil {
		edit(pod)
	}
	created, err := s.admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating %s's pod: %w", workload.GetName(), err)
	}
	token, err := cluster.ServiceAccountToken(ctx, s.admin, created, tokenLifetime)
	if err != nil {
		return "", err
	}
	return s.cp.WriteTokenKubeconfig(created.Name, token)
}

// daemonPodIdentity is identity where kube-controller-manager runs: the device plugin's pod
// on node is the one its DaemonSet's controller makes (a pod the sandbox made would be
// adopted and replaced by it, which revokes the pod's token), and the kubeconfig holds a token
// bound to that pod. The sandbox binds the pod to its node as the default scheduler would (it
// runs none; the DaemonSet's pods name their node in a required node affinity). The pod
// runs unchanged on the node's runtime: its host paths resolve in the kubelet's own mount
// namespace (/var/lib/kubelet is the node's directory there, /run a tmpfs).
func (s *Sandbox) daemonPodIdentity(ctx context.Context, daemonSet *unstructured.Unstructured, node string) (string, error) {
	var pod *v1.Pod
	pods := s.admin.CoreV1().Pods(daemonSet.GetNamespace())
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range list.Items {
			p := &list.Items[i]
			owner := metav1.GetControllerOf(p)
			if p.DeletionTimestamp != nil || owner == nil || owner.Kind != "DaemonSet" || owner.Name != daemonSet.GetName() {
				continue
			}
			if target, err := daemonutil.GetTargetNodeName(p); err == nil && target == node {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for DaemonSet %s's pod on %s: %w", daemonSet.GetName(), node, err)
	}
	if pod.Spec.NodeName == "" {
		binding := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID}, Target: v1.ObjectReference{Kind: "Node", Name: node}}
		if err := pods.Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("binding DaemonSet %s's pod %s to %s: %w", daemonSet.GetName(), pod.Name, node, err)
		}
		pod.Spec.NodeName = node
	}
	token, err := cluster.ServiceAccountToken(ctx, s.admin, pod, tokenLifetime)
	if err != nil {
		return "", err
	}
	return s.cp.WriteTokenKubeconfig(pod.Name, token)
}

// devicePluginPaths points the device plugin's pod's host paths at node's own kubelet
// directories, as devicePlugin.pluginPath and friends do for a kubelet with another root.
func devicePluginPaths(n *node) func(*v1.Pod) {
	return func(p *v1.Pod) {
		for i := range p.Spec.Volumes {
			hp := p.Spec.Volumes[i].HostPath
			if hp == nil {
				continue
			}
			switch p.Spec.Volumes[i].Name {
			case "device-plugins":
				hp.Path = n.kubelet.DevicePluginDir
			case "pod-resources":
				hp.Path = filepath.Dir(n.kubelet.PodResourcesSocket)
			case "cdi-specs":
				hp.Path = n.kubelet.CDIDir
			default:
				// Nothing else of the host is the sandbox's to give.
				hp.Path, hp.Type = n.dir, nil
			}
		}
	}
}

// withoutProbes drops the pod's probes: the fake runtime runs no process the kubelet could
// probe (the component itself runs in this process), so they would keep it unready.
func withoutProbes(p *v1.Pod) {
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil
	}
}

// schedulerNameOf is the profile name GPU pods get from the webhook.
func schedulerNameOf(webhook *unstructured.Unstructured) string {
	containers, _, _ := unstructured.NestedSlice(webhook.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--scheduler-name="); ok {
				return v
			}
		}
	}
	return api.DefaultSchedulerName
}
