// Package admission applies the admission policies, service accounts and RBAC of
// manifests/install.yaml (rendered from the Helm chart) to a real kube-apiserver
// (test/cluster) and checks what each identity may and may not do: an ordinary user
// (cluster.UserAdmin, in system:masters: RBAC would let it do anything, admission must not),
// the scheduler and the device plugins, which authenticate as the chart's service accounts
// with tokens the API server issued bound to their pods (a device plugin's pod on its node),
// exactly as in a cluster.
package admission

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/generated/openapi"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
)

const (
	installFile   = "../../manifests/install.yaml"
	ns            = "admission"
	dynamigSched  = "dynamig-scheduler"
	bindFailure   = "dynamig.io/bind-failure"
	migNode       = "gpu-node-1"
	otherNode     = "gpu-node-2"
	reservationMI = `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.10gb","placement":{"start":0,"size":1}}]`
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipping the admission tests in -short mode")
		os.Exit(0)
	}
	// The API server logs a lot through klog.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// clients are the identities: the admin; the scheduler; the device plugins of migNode and
// otherNode; a device-plugin credential that names no node (a token bound to no pod); and
// test/cluster's static token of the device plugin's user name, in system:masters (RBAC
// lets it do anything, so what it is refused, admission refuses).
type clients struct {
	admin, scheduler, devicePlugin, otherDevicePlugin, nodelessDevicePlugin, devicePluginMaster kubernetes.Interface
}

func TestAdmissionPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := cluster.Start(t, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var c clients
	if c.admin, err = cp.Client(cluster.UserAdmin); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyRBAC(ctx, t, c.admin)
	c.scheduler = identity(ctx, t, cp, c.admin, "dynamig-scheduler", "")
	c.devicePlugin = identity(ctx, t, cp, c.admin, "dynamig-device-plugin", migNode)
	c.otherDevicePlugin = identity(ctx, t, cp, c.admin, "dynamig-device-plugin", otherNode)
	c.nodelessDevicePlugin = nodelessIdentity(ctx, t, cp, c.admin, "dynamig-device-plugin")
	if c.devicePluginMaster, err = cp.Client(cluster.UserDevicePlugin); err != nil {
		t.Fatal(err)
	}
	typeCheck(t, c.admin, applyPolicies(ctx, t, c.admin))
	waitEffective(ctx, t, c)

	t.Run("refused", func(t *testing.T) { testRefused(ctx, t, c) })
	t.Run("allowed", func(t *testing.T) { testAllowed(ctx, t, c) })
	t.Run("own node", func(t *testing.T) { testOwnNode(ctx, t, c) })
	t.Run("nvidia env", func(t *testing.T) { testNvidiaEnv(ctx, t, c) })
	t.Run("relocatable", func(t *testing.T) { testRelocatable(ctx, t, cp) })
	t.Run("rbac", func(t *testing.T) { testRBAC(ctx, t, c.admin) })
}

// applyPolicies creates the manifest's ValidatingAdmissionPolicies and their bindings, as
// the admin.
func applyPolicies(ctx context.Context, t *testing.T, admin kubernetes.Interface) []*admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	var policies []*admissionregistrationv1.ValidatingAdmissionPolicy
	var bindings int
	for _, obj := range installObjects(t) {
		switch o := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			policies = append(policies, o)
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating policy %s: %v", o.Name, err)
			}
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			bindings++
			want := admissionregistrationv1.Deny
			if o.Name == "dynamig-relocatable-bare" {
				want = admissionregistrationv1.Warn
			}
			if got := o.Spec.ValidationActions; len(got) != 1 || got[0] != want {
				t.Errorf("binding %s: validationActions %v, want [%s]", o.Name, got, want)
			}
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating binding %s: %v", o.Name, err)
			}
		}
	}
	if len(policies) != 7 || bindings != 7 {
		t.Fatalf("%s: %d policies and %d bindings, want 7 and 7", installFile, len(policies), bindings)
	}
	return policies
}

// typeCheck type-checks each policy's validations against the schemas of the kinds it
// matches, as kube-controller-manager's ValidatingAdmissionPolicy status controller does
// (there is none here): a warning means an expression names a field that does not exist or
// mixes types.
func typeCheck(t *testing.T, cs kubernetes.Interface, policies []*admissionregistrationv1.ValidatingAdmissionPolicy) {
	t.Helper()
	checker := &validating.TypeChecker{
		SchemaResolver: resolver.NewDefinitionsSchemaResolver(openapi.GetOpenAPIDefinitions, scheme.Scheme),
		RestMapper:     restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery())),
	}
	for _, p := range policies {
		for _, w := range checker.Check(p) {
			t.Errorf("policy %s: type checking %s: %s", p.Name, w.FieldRef, w.Warning)
		}
	}
	// The checker does see the Pod schema: a misspelt field is reported.
	typo := policies[0].DeepCopy()
	typo.Spec.Validations = []admissionregistrationv1.Validation{{Expression: "object.spec.schedulerNam == 'x'"}}
	if len(checker.Check(typo)) == 0 {
		t.Error("the type checker did not report object.spec.schedulerNam")
	}
}

// waitEffective polls, with dry-run requests, until each policy refuses what it should.
func waitEffective(ctx context.Context, t *testing.T, c clients) {
	t.Helper()
	bound := gpuPod("probe-bound", dynamigSched)
	if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, bound, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	probes := map[string]func() error{
		"dynamig-gpu-pods": func() error {
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, gpuPod("probe", "default-scheduler"), dry)
			return err
		},
		"dynamig-reservation-annotations": func() error {
			p := cpuPod("probe", "default-scheduler", "")
			p.Annotations = map[string]string{api.BindPhaseAnnotation: api.BindPhaseSuccess}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, dry)
			return err
		},
		"dynamig-binding-reservations": func() error {
			return c.admin.CoreV1().Pods(ns).Bind(ctx, reservationBinding("probe-bound", bound.UID), dry)
		},
		"dynamig-relocatable": func() error {
			p := cpuPod("probe", "default-scheduler", "")
			p.Annotations = map[string]string{api.RelocatableAnnotation: "yes"}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, dry)
			return err
		},
		"dynamig-nvidia-env": func() error {
			p := cpuPod("probe", "default-scheduler", "")
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, dry)
			return err
		},
	}
	deadline := time.Now().Add(time.Minute)
	for name, probe := range probes {
		for {
			err := probe()
			if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+name+"'") {
				break
			}
			if err == nil && name == "dynamig-binding-reservations" {
				// A dry-run Binding that went through must not have bound the pod.
				p, gerr := c.admin.CoreV1().Pods(ns).Get(ctx, "probe-bound", metav1.GetOptions{})
				if gerr == nil && p.Spec.NodeName != "" {
					t.Fatalf("a dry-run Binding bound the probe pod before %s was effective", name)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("policy %s not effective within a minute; last probe: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// refusal is an operation that admission must refuse, the policy that refuses it and the
// texts its message must contain.
type refusal struct {
	name   string
	policy string
	do     func(ctx context.Context) error
	want   []string
	// invalid: the refusal is 422 Invalid (a malformed pod), not 403 Forbidden.
	invalid bool
}

func testRefused(ctx context.Context, t *testing.T, c clients) {
	// Pods the update cases work on: created by the admin, bound by the scheduler with a
	// reservation.
	reserved := createReserved(ctx, t, c, "refused-target")

	mergePatch := func(cs kubernetes.Interface, name string, annotations map[string]any, sub ...string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, annotationsPatch(annotations), metav1.PatchOptions{}, sub...)
			return err
		}
	}
	cases := []refusal{{
		name:   "user pod sets the MIG reservation",
		policy: "dynamig-reservation-annotations",
		do: func(ctx context.Context) error {
			p := gpuPod("sets-reservation", dynamigSched)
			p.Annotations = map[string]string{api.MigReservationsAnnotation: reservationMI}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		want: []string{"do not set hami.io/vgpu-mig-allocations: the scheduler writes it", "remove it from the pod"},
	}, {
		name:   "CPU pod sets two reservation keys",
		policy: "dynamig-reservation-annotations",
		do: func(ctx context.Context) error {
			p := cpuPod("sets-two", "default-scheduler", "")
			p.Annotations = map[string]string{api.AssignedNodeAnnotation: migNode, api.BindTimeAnnotation: "1", "example.com/free": "x"}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		want: []string{"do not set ", api.AssignedNodeAnnotation, api.BindTimeAnnotation, "the scheduler writes them"},
	}, {
		name:   "GPU pod for the default scheduler",
		policy: "dynamig-gpu-pods",
		do: func(ctx context.Context) error {
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, gpuPod("default-sched", ""), metav1.CreateOptions{})
			return err
		},
		want:    []string{"names schedulerName default-scheduler", "set schedulerName: dynamig-scheduler"},
		invalid: true,
	}, {
		name:   "GPU requested by an init container, another scheduler",
		policy: "dynamig-gpu-pods",
		do: func(ctx context.Context) error {
			p := cpuPod("init-gpu", "other-scheduler", "")
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox", Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{api.ResourceCount: resource.MustParse("1")},
				Limits:   v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		want:    []string{"names schedulerName other-scheduler", "set schedulerName: dynamig-scheduler"},
		invalid: true,
	}, {
		name:   "GPU pod created with nodeName",
		policy: "dynamig-gpu-pods",
		do: func(ctx context.Context) error {
			p := gpuPod("node-name", dynamigSched)
			p.Spec.NodeName = migNode
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		want:    []string{"sets nodeName " + migNode, "do not set nodeName", "set schedulerName: dynamig-scheduler"},
		invalid: true,
	}, {
		name:   "user changes bind-phase",
		policy: "dynamig-reservation-annotations",
		do:     mergePatch(c.admin, reserved.Name, map[string]any{api.BindPhaseAnnotation: api.BindPhaseSuccess}),
		want:   []string{"do not set hami.io/bind-phase: the scheduler writes it", "leave it as it is"},
	}, {
		name:   "user changes bind-phase through pods/status",
		policy: "dynamig-reservation-annotations",
		do:     mergePatch(c.admin, reserved.Name, map[string]any{api.BindPhaseAnnotation: api.BindPhaseFailed}, "status"),
		want:   []string{"do not set hami.io/bind-phase: the scheduler writes it"},
	}, {
		name:   "user rewrites the reservation with an update",
		policy: "dynamig-reservation-annotations",
		do: func(ctx context.Context) error {
			p, err := c.admin.CoreV1().Pods(ns).Get(ctx, reserved.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(reservationMI, `"start":0`, `"start":1`, 1)
			_, err = c.admin.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{})
			return err
		},
		want: []string{"do not set hami.io/vgpu-mig-allocations: the scheduler writes it"},
	}, {
		name:   "user removes the reservation",
		policy: "dynamig-reservation-annotations",
		do:     mergePatch(c.admin, reserved.Name, map[string]any{api.MigReservationsAnnotation: nil}),
		want:   []string{"do not remove hami.io/vgpu-mig-allocations", "delete the pod"},
	}, {
		name:   "user binds with a reservation",
		policy: "dynamig-binding-reservations",
		do: func(ctx context.Context) error {
			p := createPod(ctx, t, c.admin, gpuPod("user-binds", dynamigSched))
			return c.admin.CoreV1().Pods(ns).Bind(ctx, reservationBinding(p.Name, p.UID), metav1.CreateOptions{})
		},
		want: []string{"do not bind with ", api.MigReservationsAnnotation, api.BindPhaseAnnotation, "only dynamig-scheduler writes them", "create the pod with schedulerName: dynamig-scheduler"},
	}, {
		name:   "user binds with a reservation through the legacy bindings resource",
		policy: "dynamig-binding-reservations",
		do: func(ctx context.Context) error {
			p := createPod(ctx, t, c.admin, gpuPod("user-binds-legacy", dynamigSched))
			return c.admin.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").
				Body(reservationBinding(p.Name, p.UID)).Do(ctx).Error()
		},
		want: []string{"do not bind with ", api.MigReservationsAnnotation, "only dynamig-scheduler writes them"},
	}, {
		name:   "device plugin binds with a reservation",
		policy: "dynamig-binding-reservations",
		do: func(ctx context.Context) error {
			p := createPod(ctx, t, c.admin, gpuPod("dp-binds", dynamigSched))
			// As the device plugin's user name in system:masters: its RBAC has no
			// pods/binding, so only with every right does the policy's refusal show.
			return c.devicePluginMaster.CoreV1().Pods(ns).Bind(ctx, reservationBinding(p.Name, p.UID), metav1.CreateOptions{})
		},
		want: []string{"do not bind with ", "only dynamig-scheduler writes them"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do(ctx)
			if err == nil {
				t.Fatal("admitted, want refused")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+tc.policy+"'") {
				t.Errorf("refused by something other than policy %s: %v", tc.policy, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message lacks %q: %v", w, err)
				}
			}
			if tc.invalid && !apierrors.IsInvalid(err) {
				t.Errorf("want 422 Invalid: %v", err)
			}
			if !tc.invalid && !apierrors.IsForbidden(err) {
				t.Errorf("want 403 Forbidden: %v", err)
			}
		})
	}
	// Nothing the refusals tried reached the stored pod.
	got, err := c.admin.CoreV1().Pods(ns).Get(ctx, reserved.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating || got.Annotations[api.MigReservationsAnnotation] != reservationMI {
		t.Errorf("the refused writes changed the pod's annotations: %v", got.Annotations)
	}
	for _, name := range []string{"user-binds", "user-binds-legacy", "dp-binds"} {
		if p, err := c.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Errorf("pod %s: a refused Binding bound it (node %q, err %v)", name, p.Spec.NodeName, err)
		}
	}
}

func testAllowed(ctx context.Context, t *testing.T, c clients) {
	cases := []struct {
		name string
		do   func(ctx context.Context) error
	}{{
		name: "GPU pod for dynamig-scheduler without nodeName",
		do: func(ctx context.Context) error {
			p := gpuPod("gpu-ok", dynamigSched)
			p.Spec.Containers[0].Resources.Requests = p.Spec.Containers[0].Resources.Limits
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
	}, {
		name: "CPU pod with another scheduler and a nodeName",
		do: func(ctx context.Context) error {
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, cpuPod("cpu-ok", "other-scheduler", "some-node"), metav1.CreateOptions{})
			return err
		},
	}, {
		name: "user pod with user annotations of the hami.io domain",
		do: func(ctx context.Context) error {
			p := gpuPod("user-annotations", dynamigSched)
			p.Annotations = map[string]string{api.VGPUModeAnnotation: api.ModeMIG, api.GPUSchedulerPolicyAnnotation: api.PolicySpread,
				api.NodeSchedulerPolicyAnnotation: api.PolicyBinpack, api.UseGPUTypeAnnotation: "H100"}
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
	}, {
		name: "scheduler binds with the reservation, device plugin completes it",
		do: func(ctx context.Context) error {
			p := createReserved(ctx, t, c, "allowed-target")
			if p.Spec.NodeName != migNode {
				return fmt.Errorf("bound to %q", p.Spec.NodeName)
			}
			// writeBack: the runtime identity and bind-phase success, with a resourceVersion.
			completed := strings.Replace(reservationMI, `"placement"`, `"giID":3,"ciID":0,"placement"`, 1)
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion, "annotations": map[string]any{
				api.MigReservationsAnnotation: completed, api.BindPhaseAnnotation: api.BindPhaseSuccess}}})
			if _, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("device plugin writeBack: %w", err)
			}
			// failed: bind-phase failed with the cause.
			if _, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, annotationsPatch(map[string]any{
				api.BindPhaseAnnotation: api.BindPhaseFailed, bindFailure: "creating the compute instance: test"}), metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("device plugin failed: %w", err)
			}
			got, err := c.admin.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Annotations[api.MigReservationsAnnotation] != completed || got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseFailed {
				return fmt.Errorf("annotations after the device plugin's patches: %v", got.Annotations)
			}
			return nil
		},
	}, {
		name: "scheduler binds a hami-core reservation through the legacy bindings resource",
		do: func(ctx context.Context) error {
			p := createPod(ctx, t, c.admin, gpuPod("core-legacy", dynamigSched))
			b := reservationBinding(p.Name, p.UID)
			delete(b.Annotations, api.MigReservationsAnnotation)
			b.Annotations[api.DevicesAllocatedAnnotation] = "GPU-0,NVIDIA,4096,30:;"
			b.Annotations[api.DevicesToAllocateAnnotation] = "GPU-0,NVIDIA,4096,30:;"
			if err := c.scheduler.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").Body(b).Do(ctx).Error(); err != nil {
				return err
			}
			// hamicore: the device plugin empties devices-to-allocate and sets success.
			_, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, annotationsPatch(map[string]any{
				api.DevicesToAllocateAnnotation: ";", api.BindPhaseAnnotation: api.BindPhaseSuccess}), metav1.PatchOptions{})
			return err
		},
	}, {
		name: "a Binding without reservation keys, by an ordinary user",
		do: func(ctx context.Context) error {
			p := createPod(ctx, t, c.admin, cpuPod("plain-bind", "other-scheduler", ""))
			return c.admin.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID, Annotations: map[string]string{"example.com/x": "y"}},
				Target:     v1.ObjectReference{Kind: "Node", Name: "some-node"}}, metav1.CreateOptions{})
		},
	}, {
		name: "user changes unrelated annotations of a reserved GPU pod",
		do: func(ctx context.Context) error {
			p := createReserved(ctx, t, c, "unrelated")
			if _, err := c.admin.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, annotationsPatch(map[string]any{
				"example.com/owner": "team-a", api.VGPUModeAnnotation: api.ModeMIG}), metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("merge patch: %w", err)
			}
			// A full update that carries the reservation keys unchanged.
			got, err := c.admin.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got.Annotations["example.com/owner"] = "team-b"
			got.Labels = map[string]string{"app": "x"}
			if _, err := c.admin.CoreV1().Pods(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update: %w", err)
			}
			return nil
		},
	}, {
		name: "status update of a reserved GPU pod, as a kubelet or controller does",
		do: func(ctx context.Context) error {
			p, err := c.admin.CoreV1().Pods(ns).Get(ctx, "unrelated", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status.Phase = v1.PodRunning
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue})
			_, err = c.admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		},
	}, {
		name: "user deletes a reserved GPU pod",
		do: func(ctx context.Context) error {
			return c.admin.CoreV1().Pods(ns).Delete(ctx, "unrelated", metav1.DeleteOptions{})
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(ctx); err != nil {
				t.Fatalf("refused, want admitted: %v", err)
			}
		})
	}
}

// createReserved creates a GPU pod as the admin and has the scheduler bind it to migNode
// with a MIG reservation, as plugins/dynamicmig's Bind does.
func createReserved(ctx context.Context, t *testing.T, c clients, name string) *v1.Pod {
	t.Helper()
	p := createPod(ctx, t, c.admin, gpuPod(name, dynamigSched))
	if err := c.scheduler.CoreV1().Pods(ns).Bind(ctx, reservationBinding(p.Name, p.UID), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the scheduler's Binding of %s: %v", name, err)
	}
	p, err := c.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations[api.MigReservationsAnnotation] != reservationMI || p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Fatalf("pod %s after the Binding: %v", name, p.Annotations)
	}
	return p
}

func createPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, p *v1.Pod) *v1.Pod {
	t.Helper()
	got, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
	return got
}

// reservationBinding is what plugins/dynamicmig's Bind creates for a MIG pod.
func reservationBinding(name string, uid types.UID) *v1.Binding {
	return &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, Annotations: map[string]string{
			api.AssignedNodeAnnotation:    migNode,
			api.BindTimeAnnotation:        "1700000000",
			api.BindPhaseAnnotation:       api.BindPhaseAllocating,
			api.MigReservationsAnnotation: reservationMI,
		}},
		Target: v1.ObjectReference{Kind: "Node", Name: migNode},
	}
}

// gpuPod asks for one nvidia.com/gpu in its limits; schedulerName "" leaves the default.
func gpuPod(name, schedulerName string) *v1.Pod {
	p := cpuPod(name, schedulerName, "")
	p.Spec.Containers[0].Resources.Limits = v1.ResourceList{api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse("10000")}
	return p
}

func cpuPod(name, schedulerName, nodeName string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: schedulerName, NodeName: nodeName, Containers: []v1.Container{{
			Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}}}}},
	}
}

// annotationsPatch is a JSON merge patch of the pod's annotations (nil removes a key).
func annotationsPatch(annotations map[string]any) []byte {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return patch
}

// testRelocatable: dynamig.io/relocatable other than "true" or "false" is refused naming the
// value (also when an update writes it, not when it keeps a value the pod had); "true" on a
// pod without a controller is admitted with a warning that it is ignored, on a controller's
// pod without one.
func testRelocatable(ctx context.Context, t *testing.T, cp *cluster.ControlPlane) {
	warnings := &warningRecorder{}
	cfg := cp.UserConfig(cluster.UserAdmin)
	cfg.WarningHandler = warnings
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	annotated := func(name, value string, owned bool) *v1.Pod {
		p := gpuPod(name, dynamigSched)
		p.Annotations = map[string]string{api.RelocatableAnnotation: value}
		if owned {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d9c", UID: "uid-web", Controller: ptr.To(true)}}
		}
		return p
	}
	const ignored = `dynamig.io/relocatable "true" is ignored on a pod without a controller`

	_, err = admin.CoreV1().Pods(ns).Create(ctx, annotated("reloc-yes", "yes", true), metav1.CreateOptions{})
	if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'dynamig-relocatable'") ||
		!strings.Contains(err.Error(), `metadata.annotations[dynamig.io/relocatable] is "yes": write "true"`) {
		t.Errorf("relocatable \"yes\": %v; want 422 Invalid from dynamig-relocatable naming the value", err)
	}

	for _, tc := range []struct {
		name, value string
		owned, warn bool
	}{
		{"reloc-bare", "true", false, true},
		{"reloc-owned", "true", true, false},
		{"reloc-bare-false", "false", false, false},
	} {
		warnings.reset()
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, annotated(tc.name, tc.value, tc.owned), metav1.CreateOptions{}); err != nil {
			t.Errorf("%s: %v; want admitted", tc.name, err)
			continue
		}
		got := warnings.texts()
		if warned := slices.ContainsFunc(got, func(w string) bool { return strings.Contains(w, ignored) }); warned != tc.warn {
			t.Errorf("%s: warnings %q; want the warning %v", tc.name, got, tc.warn)
		}
	}

	// An update that writes a wrong value is refused; one that keeps it is not.
	patch := func(name, value string) error {
		_, err := admin.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType,
			annotationsPatch(map[string]any{api.RelocatableAnnotation: value}), metav1.PatchOptions{})
		return err
	}
	if err := patch("reloc-owned", "True"); err == nil || !strings.Contains(err.Error(), `is "True"`) {
		t.Errorf("update to \"True\": %v; want refused naming the value", err)
	}
	if err := patch("reloc-owned", "false"); err != nil {
		t.Errorf("update to \"false\": %v", err)
	}
}

// warningRecorder keeps the warnings the API server sent (client-go's WarningHandler).
type warningRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warningRecorder) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = nil
}

func (w *warningRecorder) texts() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}
