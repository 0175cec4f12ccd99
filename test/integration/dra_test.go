package integration

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
)

// TestDRANodeBesideDynamigNode: a cluster where nvidia.com/gpu is also served by DRA (KEP-5004:
// a DeviceClass with extendedResourceName nvidia.com/gpu, GA in 1.37, beta and on in 1.36) on a
// node without dynamig's device plugin, beside a dynamig node. A dynamig GPU pod goes to the
// dynamig node, and one that does not fit there stays Pending rather than take DRA devices;
// a pod that asks for a DRA device through a ResourceClaim is scheduled by dynamig-scheduler
// on the DRA node and its claim allocated. Runs on every minor of the matrix.
func TestDRANodeBesideDynamigNode(t *testing.T) {
	e := newEnv(t, "dra")
	const driver, draNode, migNode = "gpu.dra.example.com", "dra-node", "dra-mig-node"
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "it-dra-gpu"}, Spec: resourcev1.DeviceClassSpec{
		Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driver + `"`}}},
		ExtendedResourceName: ptr.To(api.ResourceCount),
	}}
	if _, err := e.admin.ResourceV1().DeviceClasses().Create(e.ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.ResourceV1().DeviceClasses().Delete(e.ctx, class.Name, metav1.DeleteOptions{}) })

	// The DRA node: no dynamig inventory, no nvidia.com/gpu from a device plugin, two devices
	// in a ResourceSlice of its DRA driver.
	node := gpuNode(t, draNode, api.ModeMIG, a100)
	delete(node.Annotations, api.NodeInventoryAnnotation)
	delete(node.Status.Capacity, api.ResourceCount)
	delete(node.Status.Allocatable, api.ResourceCount)
	e.createNode(node)
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: draNode + "-" + "gpus"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: driver, NodeName: ptr.To(draNode),
		Pool:    resourcev1.ResourcePool{Name: draNode, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourcev1.Device{{Name: "gpu-0"}, {Name: "gpu-1"}},
	}}
	if _, err := e.admin.ResourceV1().ResourceSlices().Create(e.ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.ResourceV1().ResourceSlices().Delete(e.ctx, slice.Name, metav1.DeleteOptions{}) })
	e.addNode(migNode, a100)
	e.startScheduler()

	// dynamig's pods: on the dynamig node, or Pending, never on DRA devices. They ask only
	// nvidia.com/gpu (whole GPUs): where a DeviceClass maps it, kube-scheduler's
	// DynamicResources refuses a pod that also asks nvidia.com/gpumem or gpucores on every node
	// (no node advertises them; docs/troubleshooting.md).
	e.create(e.gpuPod("fits", api.ModeMIG, [2]int{1, 0}), e.gpuPod("too-big", api.ModeMIG, [2]int{2, 0}))
	e.waitRealised(60*time.Second, "fits")
	if got := e.pod("fits").Spec.NodeName; got != migNode {
		t.Errorf("fits bound to %s, want the dynamig node %s", got, migNode)
	}
	e.waitFor(30*time.Second, "too-big reported unschedulable", func() (bool, string) {
		p := e.pod("too-big")
		return scheduledMessage(p) != "", "no PodScheduled=False yet"
	})

	// A DRA pod: scheduled by dynamig-scheduler on the DRA node, its claim allocated there.
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "dra-claim", Namespace: e.ns}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: class.Name, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}}}},
	}}
	if _, err := e.admin.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	draPod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dra-pod", Namespace: e.ns}, Spec: v1.PodSpec{
		SchedulerName:  api.DefaultSchedulerName,
		ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}},
		Containers: []v1.Container{{Name: "main", Image: "busybox",
			Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
	}}
	e.create(draPod)
	e.waitFor(60*time.Second, "dra-pod bound", func() (bool, string) {
		p := e.pod("dra-pod")
		return p.Spec.NodeName != "", scheduledMessage(p)
	})
	if got := e.pod("dra-pod").Spec.NodeName; got != draNode {
		t.Errorf("dra-pod bound to %s, want the DRA node %s", got, draNode)
	}
	got, err := e.admin.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Allocation == nil || len(got.Status.Allocation.Devices.Results) != 1 || got.Status.Allocation.Devices.Results[0].Driver != driver {
		t.Errorf("dra-claim's allocation: %+v", got.Status.Allocation)
	}

	// Still Pending, with no reservation and no DRA claim made for it.
	p := e.pod("too-big")
	if p.Spec.NodeName != "" {
		t.Errorf("too-big bound to %s", p.Spec.NodeName)
	}
	if _, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
		t.Errorf("too-big carries a reservation: %s", p.Annotations[api.MigReservationsAnnotation])
	}
	claims, err := e.admin.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if c.Name != claim.Name {
			t.Errorf("a ResourceClaim %s was made (for %v)", c.Name, c.OwnerReferences)
		}
	}
}
