package admission

import (
	"context"
	"fmt"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dynamig/dynamig/api"
)

// testOwnNode: a device plugin writes only its own node — its Node, the pods bound to it
// (reservation keys included) and its heartbeat Lease — and a device-plugin credential that
// names no node writes nothing (the policy dynamig-device-plugin-own-node).
func testOwnNode(ctx context.Context, t *testing.T, c clients) {
	for _, name := range []string{migNode, otherNode} {
		if _, err := c.admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// migNode carries a taint its device plugin must not drop.
	if _, err := c.admin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType,
		[]byte(`{"spec":{"taints":[{"key":"nvidia.com/gpu","value":"present","effect":"NoSchedule"}]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A reserved GPU pod on migNode, and a CPU pod on otherNode.
	onMig := createReserved(ctx, t, c, "own-node-target")
	onOther := createPod(ctx, t, c.admin, cpuPod("own-node-other", "other-scheduler", otherNode))
	inventory := annotationsPatch(map[string]any{api.NodeInventoryAnnotation: "[]"})
	completed := strings.Replace(reservationMI, `"placement"`, `"giID":3,"ciID":0,"placement"`, 1)
	writeBack := annotationsPatch(map[string]any{api.MigReservationsAnnotation: completed, api.BindPhaseAnnotation: api.BindPhaseSuccess})
	lease := func(node string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName(node), Namespace: api.DefaultSystemNamespace}}
	}

	refused := []struct {
		name string
		do   func() error
		want string
		// rbac: RBAC refuses first (the plugin has no such right); the policy covers it too.
		rbac bool
	}{
		{"another node's Node", func() error {
			_, err := c.otherDevicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, inventory, metav1.PatchOptions{})
			return err
		}, "the device plugin of node " + otherNode + " may write only its own Node, not " + migNode, false},
		{"another node's Node status", func() error {
			_, err := c.otherDevicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, inventory, metav1.PatchOptions{}, "status")
			return err
		}, `cannot patch resource "nodes/status"`, true},
		{"reservation keys of another node's pod", func() error {
			_, err := c.otherDevicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType, writeBack, metav1.PatchOptions{})
			return err
		}, "the device plugin of node " + otherNode + " may write only pods bound to it; " + ns + "/" + onMig.Name + " is on node " + migNode, false},
		{"bind-phase failed on another node's pod", func() error {
			_, err := c.otherDevicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType,
				annotationsPatch(map[string]any{api.BindPhaseAnnotation: api.BindPhaseFailed, bindFailure: "x"}), metav1.PatchOptions{})
			return err
		}, "may write only pods bound to it", false},
		{"other annotations of another node's pod", func() error {
			_, err := c.otherDevicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType,
				annotationsPatch(map[string]any{"example.com/x": "y"}), metav1.PatchOptions{})
			return err
		}, "may write only pods bound to it", false},
		{"another node's pod status", func() error {
			_, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onOther.Name, types.MergePatchType,
				[]byte(`{"status":{"conditions":[{"type":"example.com/x","status":"True"}]}}`), metav1.PatchOptions{}, "status")
			return err
		}, `cannot patch resource "pods/status"`, true},
		{"another node's heartbeat Lease", func() error {
			_, err := c.otherDevicePlugin.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(ctx, lease(migNode), metav1.CreateOptions{})
			return err
		}, "may write only the Lease " + api.HeartbeatLeaseName(otherNode) + ", not " + api.HeartbeatLeaseName(migNode), false},
		// On its own node, only its own fields.
		{"a control-plane label on its own Node", func() error {
			_, err := c.devicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`), metav1.PatchOptions{})
			return err
		}, "may change only the annotation hami.io/node-nvidia-register of its Node; this request changes labels", false},
		{"a node-restriction label on its own Node", func() error {
			_, err := c.devicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/x":"y"}}}`), metav1.PatchOptions{})
			return err
		}, "this request changes labels", false},
		{"its own Node's taints dropped", func() error {
			_, err := c.devicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{})
			return err
		}, "this request changes spec", false},
		{"another annotation of its own Node", func() error {
			_, err := c.devicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, annotationsPatch(map[string]any{"example.com/x": "y"}), metav1.PatchOptions{})
			return err
		}, "this request changes annotation example.com/x", false},
		{"its own node's pod relabelled", func() error {
			_, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"payments"}}}`), metav1.PatchOptions{})
			return err
		}, "may change only the reservation keys and dynamig.io/bind-failure of its pods; this request changes labels", false},
		{"another annotation of its own node's pod", func() error {
			_, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType, annotationsPatch(map[string]any{"example.com/x": "y"}), metav1.PatchOptions{})
			return err
		}, "this request changes annotation example.com/x", false},
		{"a pod created on its own node", func() error {
			_, err := c.devicePlugin.CoreV1().Pods(ns).Create(ctx, cpuPod("own-node-created", "other-scheduler", migNode), metav1.CreateOptions{})
			return err
		}, `cannot create resource "pods"`, true},
		{"a pod of its own node evicted", func() error {
			return c.devicePlugin.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: onMig.Name}})
		}, `cannot create resource "pods/eviction"`, true},
		{"a credential without a node patches a pod", func() error {
			_, err := c.nodelessDevicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType, writeBack, metav1.PatchOptions{})
			return err
		}, "the device plugin's credentials name no node", false},
		{"a credential without a node patches a Node", func() error {
			_, err := c.nodelessDevicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, inventory, metav1.PatchOptions{})
			return err
		}, "the device plugin's credentials name no node", false},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			err := tc.do()
			by := "dynamig-device-plugin-own-node"
			if tc.rbac {
				by = "dynamig-system:dynamig-device-plugin"
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), by) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a refusal (%s) saying %q, got %v", by, tc.want, err)
			}
		})
	}
	// Nothing of the refused writes landed.
	n, err := c.admin.CoreV1().Nodes().Get(ctx, migNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; len(n.Spec.Taints) != 1 || cp || n.Annotations["example.com/x"] != "" {
		t.Errorf("the refused writes changed the Node: %v %v %v", n.Spec.Taints, n.Labels, n.Annotations)
	}
	got, err := c.admin.CoreV1().Pods(ns).Get(ctx, onMig.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[api.MigReservationsAnnotation] != reservationMI || got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("the refused writes changed the pod: %v", got.Annotations)
	}

	allowed := []struct {
		name string
		do   func() error
	}{
		{"its own Node", func() error {
			_, err := c.devicePlugin.CoreV1().Nodes().Patch(ctx, migNode, types.MergePatchType, inventory, metav1.PatchOptions{})
			return err
		}},
		{"its own heartbeat Lease, created then renewed", func() error {
			l, err := c.devicePlugin.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(ctx, lease(migNode), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			_, err = c.devicePlugin.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		}},
		{"reservation keys of its own node's pod", func() error {
			_, err := c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.MergePatchType, writeBack, metav1.PatchOptions{})
			return err
		}},
		// The device plugin's own patches: JSON patches whose test operations hold them to
		// the pod's UID and resourceVersion (deviceplugin/allocate patchAnnotations).
		{"bind-phase failed with the reason, held to the pod's UID", func() error {
			p, err := c.admin.CoreV1().Pods(ns).Get(ctx, onMig.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.JSONPatchType, []byte(fmt.Sprintf(`[
				{"op":"test","path":"/metadata/uid","value":%q},
				{"op":"test","path":"/metadata/resourceVersion","value":%q},
				{"op":"add","path":"/metadata/annotations/dynamig.io~1bind-failure","value":"x"},
				{"op":"add","path":"/metadata/annotations/hami.io~1bind-phase","value":"failed"}]`, p.UID, p.ResourceVersion)), metav1.PatchOptions{})
			if err != nil {
				return err
			}
			// The same patch for a pod of another UID is refused, and writes nothing.
			_, err = c.devicePlugin.CoreV1().Pods(ns).Patch(ctx, onMig.Name, types.JSONPatchType,
				[]byte(`[{"op":"test","path":"/metadata/uid","value":"another-uid"},{"op":"add","path":"/metadata/annotations/dynamig.io~1bind-failure","value":"y"}]`), metav1.PatchOptions{})
			if err == nil {
				return fmt.Errorf("a patch held to another UID was applied")
			}
			got, gerr := c.admin.CoreV1().Pods(ns).Get(ctx, onMig.Name, metav1.GetOptions{})
			if gerr != nil || got.Annotations[bindFailure] != "x" {
				return fmt.Errorf("after the refused patch: %v %v", got.Annotations, gerr)
			}
			return nil
		}},
	}
	for _, tc := range allowed {
		t.Run("allowed/"+tc.name, func(t *testing.T) {
			if err := tc.do(); err != nil {
				t.Fatalf("refused, want admitted: %v", err)
			}
		})
	}
}
