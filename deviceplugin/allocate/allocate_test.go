package allocate

import (
	"context"
	"crypto/ed25519"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/signing"
)

const node = "mig-node"

type env struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	sim    *sim.Sim
	mgr    *instances.Manager
	cp     *checkpoint.Checkpoint
	a      *Allocator
	gpu    string
	// key signs the reservations as the scheduler does; the Allocator accepts it.
	key ed25519.PrivateKey
}

func newEnv(t *testing.T, objs ...runtime.Object) *env {
	t.Helper()
	s, err := sim.New(sim.Options{Seed: node}, sim.GPUSpec{Model: "NVIDIA A100-PCIE-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	mgr, err := instances.New(s)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: context.Background(), client: fake.NewClientset(objs...), sim: s, mgr: mgr, cp: cp, gpu: mgr.GPUs()[0], key: key}
	e.a, err = New(Options{NodeName: node, Client: e.client, Instances: mgr, Checkpoint: cp, Verifier: signing.NewStaticVerifier(key.Public().(ed25519.PublicKey)),
		PreemptionWait: 3 * time.Second, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pod is a pod bound to the node with MIG reservations: devices[i] placements for container i.
func (e *env) pod(name string, containers ...[]api.Placement) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
		Annotations: map[string]string{api.BindPhaseAnnotation: api.BindPhaseAllocating}}, Spec: v1.PodSpec{NodeName: node}}
	var recs []api.MigReservation
	for i, pls := range containers {
		c := v1.Container{Name: "c" + string(rune('0'+i))}
		if len(pls) > 0 {
			c.Resources.Limits = v1.ResourceList{api.ResourceCount: *resource.NewQuantity(int64(len(pls)), resource.DecimalSI)}
		}
		for d, pl := range pls {
			recs = append(recs, api.MigReservation{ContainerIndex: i, DeviceIndex: d, GPUUUID: e.gpu, Profile: profileFor(pl.Size), Placement: pl})
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		e.t.Fatal(err)
	}
	p.Annotations[api.MigReservationsAnnotation] = raw
	e.create(p)
	return p
}

// create signs the pod's reservation, as the scheduler does on the Binding, and creates it.
func (e *env) create(p *v1.Pod) {
	e.t.Helper()
	if err := api.SignReservation(e.key, string(p.UID), p.Spec.NodeName, p.Annotations); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func profileFor(size int) string {
	return map[int]string{1: "1g.5gb", 2: "2g.10gb", 4: "3g.20gb", 8: "7g.40gb"}[size]
}

// handOff takes the hand-off Lease for the pod as the scheduler's Bind does.
func (e *env) handOff(p *v1.Pod) {
	e.t.Helper()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HandoffLeaseName(node), Namespace: api.DefaultSystemNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(p.Namespace + "/" + p.Name + "/" + string(p.UID))}}
	leases := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace)
	if _, err := leases.Update(e.ctx, lease, metav1.UpdateOptions{}); err != nil {
		if _, err := leases.Create(e.ctx, lease, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) allocate(devices int) (*pluginapi.ContainerAllocateResponse, error) {
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = "dev-" + string(rune('a'+i))
	}
	return e.a.Allocate(e.ctx, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
}

func (e *env) get(name string) *v1.Pod {
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) gis() []sim.GpuInstanceState { return e.sim.Snapshot()[0].GpuInstances }

func pls(p ...api.Placement) []api.Placement { return p }
func at(start, size int) api.Placement       { return api.Placement{Start: start, Size: size} }

func TestSeedAllocate(t *testing.T) {
	e := newEnv(t)
	p := e.pod("gpu-pod1", pls(at(0, 2), at(2, 2)))
	e.handOff(p)
	resp, err := e.allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	gis := e.gis()
	if len(gis) != 2 || gis[0].ProfileName != "2g.10gb" {
		t.Fatalf("instances: %+v", gis)
	}
	uuids := strings.Split(resp.Envs["NVIDIA_VISIBLE_DEVICES"], ",")
	if len(uuids) != 2 || !strings.HasPrefix(uuids[0], "MIG-") {
		t.Errorf("env: %v", resp.Envs)
	}
	got := e.get("gpu-pod1")
	recs, err := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
	if err != nil || !recs[0].Realized() || !recs[1].Realized() || recs[0].MigUUID != uuids[0] {
		t.Errorf("runtime identity: %+v %v", recs, err)
	}
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Errorf("bind phase: %q", got.Annotations[api.BindPhaseAnnotation])
	}
	lease, _ := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(e.ctx, api.HandoffLeaseName(node), metav1.GetOptions{})
	if lease.Spec.HolderIdentity != nil {
		t.Errorf("the Lease must be released after the last container: %v", *lease.Spec.HolderIdentity)
	}
	if cp := e.cp.Entries(); len(cp) != 2 || cp[0].State != checkpoint.Created {
		t.Errorf("checkpoint: %+v", cp)
	}
	// With the Lease released, a stray Allocate is refused and creates nothing.
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "held by no pod") {
		t.Errorf("stray Allocate: %v", err)
	}
	if len(e.gis()) != 2 {
		t.Errorf("a refused Allocate created something")
	}
}

func TestContainersInOrderAndRepeatedAllocate(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(0, 2)), nil, pls(at(4, 4)))
	e.handOff(p)
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	mid := e.get("p")
	if mid.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("not the last container yet")
	}
	// The annotation patch of the second container is lost (a crash): its instance exists
	// in the checkpoint; the repeated call converges on it instead of making another.
	lost := 1
	e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if lost > 0 {
			lost--
			return true, nil, errors.New("connection reset")
		}
		return false, nil, nil
	})
	if _, err := e.allocate(1); err == nil {
		t.Fatal("the patch was supposed to fail")
	}
	before := len(e.gis())
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	if len(e.gis()) != before {
		t.Errorf("a repeated Allocate created a new instance: %d → %d", before, len(e.gis()))
	}
	recs, _ := api.DecodeMigReservations(e.get("p").Annotations[api.MigReservationsAnnotation])
	if !recs[0].Realized() || !recs[1].Realized() || recs[1].ContainerIndex != 2 {
		t.Errorf("reservations: %+v", recs)
	}
}

func TestForgedAndTamperedReservations(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(0, 2)))
	// No Lease at all.
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "no hand-off Lease") {
		t.Errorf("without a Lease: %v", err)
	}
	// The Lease names another pod UID.
	e.handOff(p)
	other := p.DeepCopy()
	other.UID = "someone-else"
	e.handOff(other)
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "no longer exists") {
		t.Errorf("forged holder: %v", err)
	}
	// Tampered after the hand-off, unsigned, or signed by a key the plugin does not accept.
	// None creates anything, and each says why.
	for _, tc := range []struct {
		name    string
		edit    func(p *v1.Pod)
		wantErr string
	}{
		{"placement edited", func(p *v1.Pod) {
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], `"start":0`, `"start":2`, 1)
		}, "pod default/p: the signature of key"},
		{"unsigned", func(p *v1.Pod) { delete(p.Annotations, api.ReservationSignatureAnnotation) }, "pod default/p carries no dynamig.io/reservation-signature"},
		{"wrong key", func(p *v1.Pod) {
			k, _ := signing.GenerateKey()
			_ = api.SignReservation(k, string(p.UID), p.Spec.NodeName, p.Annotations)
		}, "which is not in ConfigMap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.handOff(p)
			pod := e.get("p")
			saved := pod.DeepCopy()
			tc.edit(pod)
			if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v, want %q", err, tc.wantErr)
			}
			if len(e.gis()) != 0 {
				t.Errorf("a refused Allocate created instances: %+v", e.gis())
			}
			if got := e.get("p"); got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseFailed || !strings.Contains(got.Annotations[bindFailureAnnotation], tc.wantErr) {
				t.Errorf("bind phase %q, failure %q", got.Annotations[api.BindPhaseAnnotation], got.Annotations[bindFailureAnnotation])
			}
			saved.ResourceVersion = ""
			if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, saved, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAmbiguousAllocateRefused(t *testing.T) {
	e := newEnv(t)
	a := e.pod("a", pls(at(0, 2)))
	e.pod("b", pls(at(2, 2))) // bound, still allocating, not the holder
	e.handOff(a)
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "cannot tell whose Allocate") {
		t.Errorf("ambiguous: %v", err)
	}
	if len(e.gis()) != 0 {
		t.Errorf("created on an ambiguous call")
	}
}

func TestReclaimOnlyEndedPods(t *testing.T) {
	e := newEnv(t)
	a := e.pod("a", pls(at(0, 2)))
	e.handOff(a)
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	b := e.pod("b", pls(at(2, 2)))
	e.handOff(b)
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API cannot be read: nothing is destroyed.
	e.client.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unreachable")
	})
	if err := e.a.Reclaim(e.ctx); err == nil {
		t.Error("Reclaim must report the unreadable API")
	}
	if len(e.gis()) != 2 {
		t.Fatalf("an unreadable API destroyed instances: %+v", e.gis())
	}
	e.client.ReactionChain = e.client.ReactionChain[1:]
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	gis := e.gis()
	if len(gis) != 1 || gis[0].Placement != at(2, 2) {
		t.Errorf("reclaim must take exactly a's instance: %+v", gis)
	}
	// b ends (Succeeded): its instance goes too.
	done := e.get("b")
	done.Status.Phase = v1.PodSucceeded
	e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, done, metav1.UpdateOptions{})
	if err := e.a.Reclaim(e.ctx); err != nil || len(e.gis()) != 0 || len(e.cp.Entries()) != 0 {
		t.Errorf("after b ended: %v %+v %+v", err, e.gis(), e.cp.Entries())
	}
}

func TestPreemptorWaitsForVictim(t *testing.T) {
	e := newEnv(t)
	victim := e.pod("victim", pls(at(0, 8)))
	e.handOff(victim)
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	// The victim is being deleted (graceful termination) when the preemptor arrives.
	v := e.get("victim")
	v.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), v, "default")
	preemptor := e.pod("preemptor", pls(at(0, 2)))
	e.handOff(preemptor)
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("pods"), "default", "victim")
	}()
	start := time.Now()
	if _, err := e.allocate(1); err != nil {
		t.Fatalf("the preemptor must get its instance once the victim is gone: %v", err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Errorf("it did not wait for the victim")
	}
	if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(0, 2) {
		t.Errorf("instances: %+v", gis)
	}
	// A running pod's instance is never taken: double booking is refused at once.
	runner := e.pod("runner", pls(at(0, 2)))
	e.handOff(runner)
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "double-book") {
		t.Errorf("overlap with a running pod: %v", err)
	}
}

func TestFailedComputeInstanceRollsBack(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(0, 2)))
	e.handOff(p)
	e.sim.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorUnknown)
	if _, err := e.allocate(1); err == nil || !strings.Contains(err.Error(), "compute instance") {
		t.Fatalf("want the CI failure: %v", err)
	}
	if len(e.gis()) != 0 || len(e.cp.Entries()) != 0 {
		t.Fatalf("a failed create left state behind: %+v %+v", e.gis(), e.cp.Entries())
	}
	got := e.get("p")
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseFailed || !strings.Contains(got.Annotations[bindFailureAnnotation], "compute instance") {
		t.Errorf("bind phase: %v", got.Annotations)
	}
	lease, _ := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(e.ctx, api.HandoffLeaseName(node), metav1.GetOptions{})
	if lease.Spec.HolderIdentity != nil {
		t.Errorf("a failed pod must not keep the node's hand-off")
	}
}

func TestSecondDeviceFailureRollsBackTheFirst(t *testing.T) {
	e := newEnv(t)
	// An instance dynamig did not make sits where the second device is reserved.
	dev, _ := e.sim.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(14, at(2, 2)); err != nil {
		t.Fatal(err)
	}
	p := e.pod("p", pls(at(0, 2), at(2, 2)))
	e.handOff(p)
	if _, err := e.allocate(2); err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Fatalf("want a refusal naming the foreign instance: %v", err)
	}
	if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(2, 2) {
		t.Errorf("the first device must be rolled back and the foreign instance left alone: %+v", gis)
	}
}

// TestInterruptedCreateIsRedone: the plugin died after recording the intent and creating
// the GI, before the CI; the next Allocate clears the half-made GI and creates afresh.
func TestInterruptedCreateIsRedone(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(4, 4)))
	e.handOff(p)
	key := checkpoint.Key{PodUID: string(p.UID), ContainerIndex: 0, DeviceIndex: 0}
	if err := e.cp.Put(checkpoint.Entry{Key: key, PodNamespace: "default", PodName: "p", GPUUUID: e.gpu, Profile: "3g.20gb", Placement: at(4, 4), State: checkpoint.Intent}); err != nil {
		t.Fatal(err)
	}
	dev, _ := e.sim.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(9, at(4, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.allocate(1); err != nil {
		t.Fatal(err)
	}
	gis := e.gis()
	if len(gis) != 1 || len(gis[0].ComputeInstances) != 1 {
		t.Errorf("want one complete instance: %+v", gis)
	}
	if got, _ := e.cp.Get(key); got.State != checkpoint.Created {
		t.Errorf("checkpoint: %+v", got)
	}
}

func TestHAMiCoreAllocate(t *testing.T) {
	e := newEnv(t)
	e.a.opts.HAMiCore = HAMiCoreOptions{HostDir: "/opt/hami", MemoryScaling: 1.5}
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "core", Namespace: "default", UID: "uid-core", Annotations: map[string]string{api.BindPhaseAnnotation: api.BindPhaseAllocating}},
		Spec: v1.PodSpec{NodeName: node, InitContainers: []v1.Container{{Name: "init"}}, Containers: []v1.Container{
			{Name: "a", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("2")}}},
			{Name: "b", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}},
		}}}
	raw := api.EncodeHAMiCoreDevices([][]api.HAMiCoreDevice{nil,
		{{UUID: "GPU-1", Type: "NVIDIA", MemoryMiB: 3000, Cores: 30}, {UUID: "GPU-2", Type: "NVIDIA", MemoryMiB: 3000, Cores: 30}},
		{{UUID: "GPU-1", Type: "NVIDIA", MemoryMiB: 1000, Cores: 10}}})
	p.Annotations[api.DevicesAllocatedAnnotation] = raw
	p.Annotations[api.DevicesToAllocateAnnotation] = raw
	e.create(p)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HandoffLeaseName(node), Namespace: api.DefaultSystemNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("default/core/uid-core")}}
	e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(e.ctx, lease, metav1.CreateOptions{})
	first, err := e.allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2", "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m",
		"CUDA_DEVICE_SM_LIMIT": "30", "CUDA_OVERSUBSCRIBE": "true"}
	for k, v := range want {
		if first.Envs[k] != v {
			t.Errorf("%s=%q, want %q", k, first.Envs[k], v)
		}
	}
	if len(first.Mounts) != 3 || first.Mounts[0].HostPath != "/opt/hami/libvgpu.so" {
		t.Errorf("mounts: %+v", first.Mounts)
	}
	if got := e.get("core"); got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("not done after the first container")
	}
	second, err := e.allocate(1)
	if err != nil || second.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-1" || second.Envs["CUDA_DEVICE_MEMORY_LIMIT_0"] != "1000m" {
		t.Fatalf("second container: %+v %v", second, err)
	}
	got := e.get("core")
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess || got.Annotations[api.DevicesToAllocateAnnotation] != ";;;" {
		t.Errorf("after the last container: %v", got.Annotations)
	}
	if len(e.gis()) != 0 {
		t.Errorf("hami-core creates no MIG instance")
	}
}
