package allocate

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/signing"
)

const node = "mig-node"

// owners is the kubelet's PodResources as a table: which container holds which IDs.
type owners map[string]podresources.Owner // by the sorted IDs joined with ","

func (o owners) Find(_ context.Context, _ string, ids []string) (podresources.Owner, error) {
	if owner, ok := o[strings.Join(slices.Sorted(slices.Values(ids)), ",")]; ok {
		return owner, nil
	}
	return podresources.Owner{}, fmt.Errorf("no active container holds devices %v", ids)
}

func (o owners) Held(context.Context, string) (map[string]bool, error) {
	held := map[string]bool{}
	for ids := range o {
		for _, id := range strings.Split(ids, ",") {
			held[id] = true
		}
	}
	return held, nil
}

type env struct {
	t       *testing.T
	ctx     context.Context
	client  *fake.Clientset
	sim     *sim.Sim
	mgr     *instances.Manager
	cp      *checkpoint.Checkpoint
	a       *Allocator
	gpu     string
	owners  owners
	cdiDir  string
	events  *record.FakeRecorder
	nextIDs int
	// key signs the reservations as the scheduler does; the Allocator accepts it.
	key ed25519.PrivateKey
	// mounts are the container paths of the last started container's mounts.
	mounts []string
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
	e := &env{t: t, ctx: context.Background(), client: fake.NewClientset(objs...), sim: s, mgr: mgr, cp: cp, gpu: mgr.GPUs()[0], key: key,
		owners: owners{}, cdiDir: filepath.Join(t.TempDir(), "cdi"), events: record.NewFakeRecorder(100)}
	specs, err := cdi.New(e.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	e.a, err = New(Options{NodeName: node, Client: e.client, Instances: mgr, Checkpoint: cp, Verifier: signing.NewStaticVerifier(key.Public().(ed25519.PublicKey)),
		Owners: e.owners, Specs: specs, Recorder: e.events, PreemptionWait: 300 * time.Millisecond, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pod is a pod bound to the node with MIG reservations: devices[i] placements for container i.
func (e *env) pod(name string, containers ...[]api.Placement) *v1.Pod {
	return e.podWithUID(name, types.UID("uid-"+name), containers...)
}

// podWithUID is pod with the given UID, for a pod recreated under the same name.
func (e *env) podWithUID(name string, uid types.UID, containers ...[]api.Placement) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid,
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

// admit gives the pod's container n device IDs, as the kubelet does at admission (Allocate
// answers their CDI names), and lists them in PodResources.
func (e *env) admit(p *v1.Pod, container string, n int) []string {
	e.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s::%d", e.gpu, e.nextIDs)
		e.nextIDs++
	}
	resp, err := e.a.Allocate(e.ctx, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(resp.CdiDevices) != n || len(resp.Envs) != 1 || resp.Envs[cdi.VisibleDevicesEnv] != cdi.NoDevices {
		e.t.Fatalf("Allocate must answer one CDI name per device and NVIDIA_VISIBLE_DEVICES=void: %+v", resp)
	}
	e.owners[strings.Join(slices.Sorted(slices.Values(ids)), ",")] = podresources.Owner{Namespace: p.Namespace, Pod: p.Name, Container: container}
	return ids
}

// start is the kubelet starting the container: PreStartContainer, then the runtime makes
// the container's environment as containerd does: a CUDA image's own
// (NVIDIA_VISIBLE_DEVICES=all), replaced by the kubelet's (Allocate's answer), then the CDI
// names resolved with the CDI library containerd uses. It returns the environment.
func (e *env) start(ids []string) (map[string]string, error) {
	return e.startOn(ids, true)
}

// startOn is start on a runtime that applies CDI, or ignores the CDI names (containerd 1.7
// with enable_cdi = false).
func (e *env) startOn(ids []string, cdiOn bool) (map[string]string, error) {
	if err := e.a.PreStartContainer(e.ctx, ids); err != nil {
		return nil, err
	}
	c, err := cdilib.NewCache(cdilib.WithSpecDirs(e.cdiDir), cdilib.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.a.Allocate(e.ctx, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	if err != nil {
		e.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/bin", cdi.VisibleDevicesEnv + "=all"}}}
	for _, k := range slices.Sorted(maps.Keys(resp.Envs)) { // containerd: the CRI config's env replaces the image's
		spec.Process.Env = slices.DeleteFunc(spec.Process.Env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
		spec.Process.Env = append(spec.Process.Env, k+"="+resp.Envs[k])
	}
	var names []string
	for _, id := range ids {
		names = append(names, cdi.QualifiedName(node, id))
	}
	if cdiOn {
		if _, err := c.InjectDevices(spec, names...); err != nil {
			e.t.Fatalf("the runtime cannot resolve %v after PreStartContainer: %v", names, err)
		}
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	e.mounts = nil
	for _, m := range spec.Mounts {
		e.mounts = append(e.mounts, m.Destination+"="+m.Source)
	}
	return env, nil
}

func (e *env) get(name string) *v1.Pod {
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) gis() []sim.GpuInstanceState { return e.sim.Snapshot()[0].GpuInstances }

// writes counts the API writes of the given verb and resource so far.
func (e *env) writes(verb, resource string) int {
	n := 0
	for _, a := range e.client.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// gaveUp says whether the plugin gave the pod up: bind-phase failed with the reason, for
// dynamig-scheduler to evict it; the plugin itself never evicts.
func (e *env) gaveUp(name string) bool {
	for _, a := range e.client.Actions() {
		if a.GetSubresource() == "eviction" {
			e.t.Fatalf("the device plugin evicted %s: node agents have no right to evict", name)
		}
	}
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	return err == nil && p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed && p.Annotations[api.BindFailureAnnotation] != ""
}

func pls(p ...api.Placement) []api.Placement { return p }
func at(start, size int) api.Placement       { return api.Placement{Start: start, Size: size} }

func TestSeedPreStart(t *testing.T) {
	e := newEnv(t)
	p := e.pod("gpu-pod1", pls(at(0, 2), at(2, 2)))
	ids := e.admit(p, "c0", 2)
	if len(e.gis()) != 0 {
		t.Fatalf("Allocate created instances: %+v", e.gis())
	}
	env, err := e.start(ids)
	if err != nil {
		t.Fatal(err)
	}
	gis := e.gis()
	if len(gis) != 2 || gis[0].ProfileName != "2g.10gb" {
		t.Fatalf("instances: %+v", gis)
	}
	uuids := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",")
	if len(uuids) != 2 || !strings.HasPrefix(uuids[0], "MIG-") {
		t.Errorf("the container's environment: %v", env)
	}
	got := e.get("gpu-pod1")
	recs, err := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
	if err != nil || !recs[0].Realized() || !recs[1].Realized() || recs[0].MigUUID != uuids[0] || recs[1].MigUUID != uuids[1] {
		t.Errorf("runtime identity: %+v %v", recs, err)
	}
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Errorf("bind phase: %q", got.Annotations[api.BindPhaseAnnotation])
	}
	if cp := e.cp.Entries(); len(cp) != 2 || cp[0].State != checkpoint.Created {
		t.Errorf("checkpoint: %+v", cp)
	}
	// The container restarts: the same instances, the same environment, no API write.
	patches := e.writes("patch", "pods")
	again, err := e.start(ids)
	if err != nil || again["NVIDIA_VISIBLE_DEVICES"] != env["NVIDIA_VISIBLE_DEVICES"] {
		t.Errorf("restart: %v %v", again, err)
	}
	if len(e.gis()) != 2 || e.writes("patch", "pods") != patches {
		t.Errorf("a restart made instances (%d) or wrote (%d patches)", len(e.gis()), e.writes("patch", "pods")-patches)
	}
	// Device IDs no container holds are refused, and nothing is made.
	if err := e.a.PreStartContainer(e.ctx, []string{"GPU-x::9"}); err == nil || !strings.Contains(err.Error(), "no active container") {
		t.Errorf("unattributable: %v", err)
	}
	if len(e.gis()) != 2 || e.gaveUp("gpu-pod1") {
		t.Errorf("an unattributable call changed something")
	}
}

// TestRecreatedPodUnderALaggingInformer: StatefulSet pod x ends and is deleted, and x is
// recreated on this node while the plugin's pod informer still shows the old x (it lags, or
// its watch is down). PodResources names only namespace/name: the container must get the
// new x's own instance, never the old x's, whose reclaim would destroy it under the running
// container once the informer catches up.
func TestRecreatedPodUnderALaggingInformer(t *testing.T) {
	e := newEnv(t)
	old := e.pod("x", pls(at(0, 2)))
	oldEnv, err := e.start(e.admit(old, "c0", 1))
	if err != nil {
		t.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := indexer.Add(e.get("x")); err != nil { // the informer saw x realised, then nothing more
		t.Fatal(err)
	}
	e.a.opts.Pods = corelisters.NewPodLister(indexer)
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	recreated := e.podWithUID("x", "uid-x-2", pls(at(2, 2)))
	env, err := e.start(e.admit(recreated, "c0", 1))
	if err != nil {
		t.Fatal(err)
	}
	if env["NVIDIA_VISIBLE_DEVICES"] == oldEnv["NVIDIA_VISIBLE_DEVICES"] {
		t.Fatalf("the recreated pod's container got the ended pod's instance %s", env["NVIDIA_VISIBLE_DEVICES"])
	}
	recs, err := api.DecodeMigReservations(e.get("x").Annotations[api.MigReservationsAnnotation])
	if err != nil || !recs[0].Realized() || recs[0].MigUUID != env["NVIDIA_VISIBLE_DEVICES"] || recs[0].Placement != at(2, 2) {
		t.Fatalf("the recreated pod's own reservation must be realised and handed out: %+v %v, env %v", recs, err, env)
	}
	// The informer catches up; reclaim takes the old x's instance and leaves the new one.
	if err := indexer.Update(e.get("x")); err != nil {
		t.Fatal(err)
	}
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(2, 2) {
		t.Errorf("after reclaim: %+v", gis)
	}
	// An ended pod the informer still shows, even one whose reservation was never realised,
	// is never taken for the container's pod either.
	ended := recreated.DeepCopy()
	ended.UID, ended.Status.Phase = "uid-x-ended", v1.PodFailed
	if err := indexer.Update(ended); err != nil {
		t.Fatal(err)
	}
	if got, err := e.a.pod(e.ctx, podresources.Owner{Namespace: "default", Pod: "x", Container: "c0"}); err != nil || got.UID != recreated.UID {
		t.Errorf("an ended pod from the informer was taken: %v %v", got.UID, err)
	}
}

func TestContainersInAnyOrderAndLostWriteBack(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(0, 2)), nil, pls(at(4, 4)))
	first := e.admit(p, "c0", 1)
	last := e.admit(p, "c2", 1)
	// The kubelet may start c2 first; the pod is realised only when both are.
	if _, err := e.start(last); err != nil {
		t.Fatal(err)
	}
	if e.get("p").Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("not every container is realised yet")
	}
	// The write-back of c0 is lost (the API server is unreachable once): the error reaches
	// the kubelet, which retries; the retry adopts the instance instead of making another.
	lost := 1
	e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if lost > 0 {
			lost--
			return true, nil, errors.New("connection reset")
		}
		return false, nil, nil
	})
	if _, err := e.start(first); err == nil {
		t.Fatal("the write-back was supposed to fail")
	}
	before := len(e.gis())
	if _, err := e.start(first); err != nil {
		t.Fatal(err)
	}
	if len(e.gis()) != before || before != 2 {
		t.Errorf("the retry made a new instance: %d → %d", before, len(e.gis()))
	}
	got := e.get("p")
	recs, _ := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
	if !recs[0].Realized() || !recs[1].Realized() || recs[1].ContainerIndex != 2 || got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Errorf("reservations: %+v, phase %q", recs, got.Annotations[api.BindPhaseAnnotation])
	}
	if e.gaveUp("p") {
		t.Error("a retriable failure evicted the pod")
	}
}

// resign edits the reservation and signs it again with the scheduler's key.
func resign(edit func(e *env, p *v1.Pod)) func(e *env, p *v1.Pod) {
	return func(e *env, p *v1.Pod) {
		edit(e, p)
		_ = api.SignReservation(e.key, string(p.UID), p.Spec.NodeName, p.Annotations)
	}
}

func TestForgedAndTamperedReservations(t *testing.T) {
	// Tampered, unsigned, or signed by a key the plugin does not accept: none creates
	// anything; the pod is failed with the reason, told in a Warning event, and evicted.
	for _, tc := range []struct {
		name    string
		edit    func(e *env, p *v1.Pod)
		wantErr string
	}{
		{"placement edited", func(e *env, p *v1.Pod) {
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], `"start":0`, `"start":2`, 1)
		}, "pod default/p: the signature of key"},
		{"unsigned", func(e *env, p *v1.Pod) { delete(p.Annotations, api.ReservationSignatureAnnotation) }, "pod default/p carries no dynamig.io/reservation-signature"},
		{"wrong key", func(e *env, p *v1.Pod) {
			k, _ := signing.GenerateKey()
			_ = api.SignReservation(k, string(p.UID), p.Spec.NodeName, p.Annotations)
		}, "which is not in ConfigMap"},
		{"signed for another node", func(e *env, p *v1.Pod) { p.Spec.NodeName = "elsewhere" }, "the signature of key"},
		// A valid signature replayed from another pod: the signed payload names that pod's UID.
		{"signature of another pod", func(e *env, p *v1.Pod) {
			_ = api.SignReservation(e.key, "another-pod-uid", p.Spec.NodeName, p.Annotations)
		}, "the signature of key"},
		// Signed with the scheduler's key (a scheduler bug, or a stolen key) but naming what
		// this node does not have or what cannot exist: refused before anything is created.
		{"another node's GPU", resign(func(e *env, p *v1.Pod) {
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], e.gpu, "GPU-00000000-0000-0000-0000-000000000000", 1)
		}), "GPU-00000000-0000-0000-0000-000000000000"},
		{"placement that does not exist", resign(func(e *env, p *v1.Pod) {
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], `"start":0`, `"start":1`, 1)
		}), "[1,3)"},
		{"malformed annotation", resign(func(e *env, p *v1.Pod) { p.Annotations[api.MigReservationsAnnotation] = `[{"containerIndex":0,` }), api.MigReservationsAnnotation},
		{"negative index", resign(func(e *env, p *v1.Pod) {
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], `"deviceIndex":0`, `"deviceIndex":-1`, 1)
		}), "deviceIndex"},
		// Validation compares records pairwise: 2000 cost seconds before the bound.
		{"2000 reservations for one device", resign(func(e *env, p *v1.Pod) {
			one := strings.Trim(p.Annotations[api.MigReservationsAnnotation], "[]")
			p.Annotations[api.MigReservationsAnnotation] = "[" + strings.Repeat(one+",", 1999) + one + "]"
		}), "must have at most 128 items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.pod("p", pls(at(0, 2)))
			ids := e.admit(p, "c0", 1)
			pod := e.get("p")
			tc.edit(e, pod)
			pod.Spec.NodeName = node // bound here in every case; only the signed node differs
			if tc.name == "signed for another node" {
				_ = api.SignReservation(e.key, string(pod.UID), "elsewhere", pod.Annotations)
			}
			if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.start(ids); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v, want %q", err, tc.wantErr)
			}
			if len(e.gis()) != 0 {
				t.Errorf("a refused reservation created instances: %+v", e.gis())
			}
			got := e.get("p")
			if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseFailed || !strings.Contains(got.Annotations[api.BindFailureAnnotation], tc.wantErr) {
				t.Errorf("bind phase %q, failure %q", got.Annotations[api.BindPhaseAnnotation], got.Annotations[api.BindFailureAnnotation])
			}
			if !e.gaveUp("p") {
				t.Error("the pod was not evicted")
			}
			select {
			case ev := <-e.events.Events:
				if !strings.HasPrefix(ev, "Warning "+ReasonUnrealisable) || !strings.Contains(ev, tc.wantErr) {
					t.Errorf("event %q", ev)
				}
			default:
				t.Error("no Warning event")
			}
		})
	}
}

func TestReclaimOnlyEndedPods(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{"a", "b"} {
		start := map[string]int{"a": 0, "b": 2}[name]
		if _, err := e.start(e.admit(e.pod(name, pls(at(start, 2))), "c0", 1)); err != nil {
			t.Fatal(err)
		}
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

// TestPreStartReadsOnlyOverlappingOwners: a create reads no other pod unless an instance
// overlaps its placement (a burst of pods on one GPU costs one read each, not one per
// earlier pod); an overlapping instance of an ended pod is reclaimed on the spot, the other
// ended pods' instances are left to the reconcile loop.
func TestPreStartReadsOnlyOverlappingOwners(t *testing.T) {
	e := newEnv(t)
	for i, name := range []string{"a", "b", "c"} {
		before := e.writes("get", "pods")
		if _, err := e.start(e.admit(e.pod(name, pls(at(i, 1))), "c0", 1)); err != nil {
			t.Fatal(err)
		}
		if reads := e.writes("get", "pods") - before; reads != 1 {
			t.Errorf("%s's PreStartContainer read %d pods, want 1 (its own)", name, reads)
		}
	}
	for _, name := range []string{"a", "b"} {
		done := e.get(name)
		done.Status.Phase = v1.PodSucceeded
		if _, err := e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, done, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// d takes a's placement: a's instance is reclaimed, b's stays until the loop runs.
	if _, err := e.start(e.admit(e.pod("d", pls(at(0, 1))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	owners := map[api.Placement]string{}
	for _, en := range e.cp.Entries() {
		owners[en.Placement] = en.PodName
	}
	if len(e.gis()) != 3 || owners[at(0, 1)] != "d" || owners[at(1, 1)] != "b" || owners[at(2, 1)] != "c" {
		t.Errorf("after d: instances %+v, owners %v", e.gis(), owners)
	}
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	if len(e.gis()) != 2 || len(e.cp.Entries()) != 2 {
		t.Errorf("the loop must reclaim b's instance: %+v", e.gis())
	}
}

func TestPreemptorWaitsForVictimAndDoubleBookingLoses(t *testing.T) {
	e := newEnv(t)
	if _, err := e.start(e.admit(e.pod("victim", pls(at(0, 8))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	// The victim is being deleted (graceful termination) when the preemptor starts: the
	// plugin waits a bounded time, then says so and the kubelet retries; nothing is failed.
	v := e.get("victim")
	v.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), v, "default")
	preemptor := e.admit(e.pod("preemptor", pls(at(0, 2))), "c0", 1)
	if _, err := e.start(preemptor); err == nil || !strings.Contains(err.Error(), "going away") {
		t.Fatalf("want a retriable wait for the victim: %v", err)
	}
	if e.gaveUp("preemptor") || e.get("preemptor").Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed {
		t.Error("a wait for a victim failed the preemptor")
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		e.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("pods"), "default", "victim")
	}()
	if _, err := e.start(preemptor); err != nil {
		t.Fatalf("the preemptor must get its instance once the victim is gone: %v", err)
	}
	if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(0, 2) {
		t.Errorf("instances: %+v", gis)
	}
	// A reservation overlapping a running pod's instance (a double booking, e.g. a Binding
	// in flight from a previous scheduler) loses: failed, evicted; the winner is untouched.
	loser := e.admit(e.pod("loser", pls(at(0, 2))), "c0", 1)
	if _, err := e.start(loser); err == nil || !strings.Contains(err.Error(), "double-book") {
		t.Errorf("overlap with a running pod: %v", err)
	}
	if !e.gaveUp("loser") || e.gaveUp("preemptor") {
		t.Errorf("evicted: loser %v, winner %v", e.gaveUp("loser"), e.gaveUp("preemptor"))
	}
	if gis := e.gis(); len(gis) != 1 || e.get("preemptor").Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Errorf("the winner was touched: %+v", gis)
	}
}

func TestFailedComputeInstanceRollsBackAndIsRetried(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	e.sim.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorUnknown)
	if _, err := e.start(ids); err == nil || !strings.Contains(err.Error(), "compute instance") {
		t.Fatalf("want the CI failure: %v", err)
	}
	if len(e.gis()) != 0 || len(e.cp.Entries()) != 0 {
		t.Fatalf("a failed create left state behind: %+v %+v", e.gis(), e.cp.Entries())
	}
	if e.gaveUp("p") {
		t.Error("a create failure is retried by the kubelet, not evicted")
	}
	if _, err := e.start(ids); err != nil || len(e.gis()) != 1 {
		t.Errorf("retry: %v %+v", err, e.gis())
	}
}

func TestForeignInstanceRollsBackTheFirstDevice(t *testing.T) {
	e := newEnv(t)
	// An instance dynamig did not make sits where the second device is reserved.
	dev, _ := e.sim.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(14, at(2, 2)); err != nil {
		t.Fatal(err)
	}
	ids := e.admit(e.pod("p", pls(at(0, 2), at(2, 2))), "c0", 2)
	if _, err := e.start(ids); err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Fatalf("want a refusal naming the foreign instance: %v", err)
	}
	if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(2, 2) {
		t.Errorf("the first device must be rolled back and the foreign instance left alone: %+v", gis)
	}
	if !e.gaveUp("p") {
		t.Error("a placement held by a foreign instance can never be realised: evict")
	}
}

// TestInterruptedCreateIsRedone: the plugin died after recording the intent and creating
// the GI, before the CI; the next PreStartContainer clears the half-made GI and creates afresh.
func TestInterruptedCreateIsRedone(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(4, 4)))
	ids := e.admit(p, "c0", 1)
	key := checkpoint.Key{PodUID: string(p.UID), ContainerIndex: 0, DeviceIndex: 0}
	if err := e.cp.Put(checkpoint.Entry{Key: key, PodNamespace: "default", PodName: "p", GPUUUID: e.gpu, Profile: "3g.20gb", Placement: at(4, 4), State: checkpoint.Intent}); err != nil {
		t.Fatal(err)
	}
	dev, _ := e.sim.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(9, at(4, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ids); err != nil {
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

// TestRebootRecreatesAtTheReservedPlacement: the node rebooted (every instance and CDI spec
// gone) while the pod stayed bound; the container's next start makes its instance again at
// the same placement and writes the new MIG UUID back.
func TestRebootRecreatesAtTheReservedPlacement(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(4, 4))), "c0", 1)
	before, err := e.start(ids)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := e.mgr.List(e.gpu)
	for _, in := range list {
		if err := e.mgr.Destroy(e.ctx, e.gpu, in.GPUInstanceID); err != nil {
			t.Fatal(err)
		}
	}
	after, err := e.start(ids)
	if err != nil {
		t.Fatal(err)
	}
	if after["NVIDIA_VISIBLE_DEVICES"] == before["NVIDIA_VISIBLE_DEVICES"] || len(e.gis()) != 1 || e.gis()[0].Placement != at(4, 4) {
		t.Errorf("want a new instance at [4,8): %v → %v, %+v", before, after, e.gis())
	}
	recs, _ := api.DecodeMigReservations(e.get("p").Annotations[api.MigReservationsAnnotation])
	if recs[0].MigUUID != after["NVIDIA_VISIBLE_DEVICES"] {
		t.Errorf("the new UUID was not written back: %+v", recs)
	}
}

func TestHAMiCorePreStart(t *testing.T) {
	e := newEnv(t)
	e.a.opts.HAMiCore = HAMiCoreOptions{HostDir: "/opt/hami", MemoryScaling: 1.5, LockDir: "/run/dynamig/vgpulock", CorePolicy: "force", LogLevel: 1, Priority: api.ResourcePriority}
	always := v1.ContainerRestartPolicyAlways
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "core", Namespace: "default", UID: "uid-core", Annotations: map[string]string{api.BindPhaseAnnotation: api.BindPhaseAllocating}},
		Spec: v1.PodSpec{NodeName: node, InitContainers: []v1.Container{{Name: "side", RestartPolicy: &always}}, Containers: []v1.Container{
			{Name: "a", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("2"), api.ResourcePriority: resource.MustParse("1")}}},
			{Name: "b", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}},
				Env: []v1.EnvVar{{Name: "CUDA_DISABLE_CONTROL", Value: "false"}, {Name: "CUDA_DISABLE_CONTROL", Value: "true"}}},
		}}}
	raw := api.EncodeHAMiCoreDevices([][]api.HAMiCoreDevice{nil,
		{{UUID: "GPU-1", Type: "NVIDIA", MemoryMiB: 3000, Cores: 30}, {UUID: "GPU-2", Type: "NVIDIA", MemoryMiB: 3000, Cores: 30}},
		{{UUID: "GPU-1", Type: "NVIDIA", MemoryMiB: 1000, Cores: 10}}})
	p.Annotations[api.DevicesAllocatedAnnotation] = raw
	p.Annotations[api.DevicesToAllocateAnnotation] = raw
	e.create(p)
	b := e.admit(p, "b", 1)
	a := e.admit(p, "a", 2)
	first, err := e.start(a)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2", "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m",
		"CUDA_DEVICE_SM_LIMIT": "30", "CUDA_OVERSUBSCRIBE": "true", "CUDA_TASK_PRIORITY": "1", "GPU_CORE_UTILIZATION_POLICY": "force", "LIBCUDA_LOG_LEVEL": "1"}
	for k, v := range want {
		if first[k] != v {
			t.Errorf("%s=%q, want %q", k, first[k], v)
		}
	}
	// HAMi's mounts: the library, the pod's cache directory, the node's lock directory, and
	// the preload of a container that does not disable it.
	wantMounts := []string{"/usr/local/vgpu/libvgpu.so=/opt/hami/libvgpu.so", "/usr/local/vgpu=/opt/hami/containers/uid-core",
		"/tmp/vgpulock=/run/dynamig/vgpulock", "/etc/ld.so.preload=/opt/hami/ld.so.preload"}
	if !slices.Equal(slices.Sorted(slices.Values(e.mounts)), slices.Sorted(slices.Values(wantMounts))) {
		t.Errorf("mounts %v, want %v", e.mounts, wantMounts)
	}
	expectEvents(t, e.drain(),
		wantEvent{"Normal " + ReasonShareAssigned, []string{`container "a" device 0: hami-core share of GPU-1: 3000 MiB, 30% of its cores`}},
		wantEvent{"Normal " + ReasonShareAssigned, []string{`container "a" device 1: hami-core share of GPU-2: 3000 MiB, 30% of its cores`}})
	if got := e.get("core"); got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("not done after the first container")
	}
	second, err := e.start(b)
	if err != nil || second["NVIDIA_VISIBLE_DEVICES"] != "GPU-1" || second["CUDA_DEVICE_MEMORY_LIMIT_0"] != "1000m" {
		t.Fatalf("second container: %+v %v", second, err)
	}
	if _, ok := second["CUDA_TASK_PRIORITY"]; ok || slices.ContainsFunc(e.mounts, func(m string) bool { return strings.HasPrefix(m, "/etc/ld.so.preload=") }) {
		t.Errorf("b (no priority, CUDA_DISABLE_CONTROL=true): %v, mounts %v", second, e.mounts)
	}
	got := e.get("core")
	if got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess || got.Annotations[api.DevicesToAllocateAnnotation] != ";;;" {
		t.Errorf("after the last container: %v", got.Annotations)
	}
	// A restart of a gets the same shares and writes nothing.
	patches := e.writes("patch", "pods")
	if again, err := e.start(a); err != nil || again["NVIDIA_VISIBLE_DEVICES"] != "GPU-1,GPU-2" || e.writes("patch", "pods") != patches {
		t.Errorf("restart: %v %v, %d patches", again, err, e.writes("patch", "pods")-patches)
	}
	if len(e.gis()) != 0 {
		t.Errorf("hami-core creates no MIG instance")
	}
}

// hookedNVML runs hook before every GPU-instance create, to break something in the middle
// of one.
type hookedNVML struct {
	nvml.Interface
	hook func()
}

func (h hookedNVML) DeviceByIndex(i int) (nvml.Device, error) {
	d, err := h.Interface.DeviceByIndex(i)
	return hookedDevice{Device: d, hook: h.hook}, err
}

type hookedDevice struct {
	nvml.Device
	hook func()
}

func (d hookedDevice) CreateGpuInstanceWithPlacement(profileID int, pl api.Placement) (nvml.GpuInstance, error) {
	d.hook()
	return d.Device.CreateGpuInstanceWithPlacement(profileID, pl)
}

// TestCheckpointWriteFailureRefusesTheCreate: the checkpoint cannot be written (its
// directory is gone) before the intent, or between the intent and the result. A create whose
// intent is not recorded does not start, one whose result is not recorded rolls back, and a
// failed create whose intent cannot be forgotten says so: each refusal names the checkpoint,
// no instance is left, and the kubelet's retry succeeds once the checkpoint can be written.
func TestCheckpointWriteFailureRefusesTheCreate(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before breaks the checkpoint before the start, during while the GI is created.
		before, during bool
		// failCreate makes the GI create fail too.
		failCreate bool
		wantErr    []string
	}{
		{name: "intent not recorded", before: true, wantErr: []string{"recording the intent"}},
		{name: "result not recorded", during: true, wantErr: []string{"recording the created instance"}},
		{name: "failed create whose intent cannot be forgotten", during: true, failCreate: true,
			wantErr: []string{"ERROR_INSUFFICIENT_RESOURCES", "forgetting the intent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			dir := filepath.Dir(e.cp.Path())
			broken := func() {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			}
			armed := tc.during
			mgr, err := instances.New(hookedNVML{Interface: e.sim, hook: func() {
				if armed {
					armed = false
					broken()
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			opts := e.a.opts
			opts.Instances = mgr
			if e.a, err = New(opts); err != nil {
				t.Fatal(err)
			}
			ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
			if tc.before {
				broken()
			}
			if tc.failCreate {
				e.sim.FailNext(0, sim.OpCreateGpuInstance, nvml.ErrorInsufficientRes)
			}
			_, err = e.start(ids)
			if err == nil {
				t.Fatal("the start must be refused")
			}
			for _, want := range append(tc.wantErr, e.cp.Path()) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal must say %q: %v", want, err)
				}
			}
			if gis := e.gis(); len(gis) != 0 {
				t.Errorf("no instance may be left behind: %+v", gis)
			}
			if e.gaveUp("p") {
				t.Error("a checkpoint failure is retried by the kubelet, not evicted")
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := e.start(ids); err != nil {
				t.Fatalf("the retry with a writable checkpoint: %v", err)
			}
			if gis, cp := e.gis(), e.cp.Entries(); len(gis) != 1 || len(cp) != 1 || cp[0].State != checkpoint.Created {
				t.Errorf("after the retry: instances %+v, checkpoint %+v", gis, cp)
			}
		})
	}
}

// TestFailMarksOnlyItsOwnPod: giving up on a pod marks and evicts that pod, never a pod that
// took its name meanwhile.
func TestFailMarksOnlyItsOwnPod(t *testing.T) {
	e := newEnv(t)
	e.pod("y", pls(at(0, 2)))
	gone := e.get("y")
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "y", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.podWithUID("y", "uid-y-2", pls(at(2, 2)))
	e.a.fail(e.ctx, gone, `container "c0"`, errors.New("cannot be realised"))
	if got := e.get("y"); got.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed || got.Annotations[api.BindFailureAnnotation] != "" {
		t.Errorf("the pod that took the name was marked failed: %v", got.Annotations)
	}
	// Its own pod is marked, however often it changed since it was read.
	own := e.get("y")
	if _, err := e.client.CoreV1().Pods("default").Patch(e.ctx, "y", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.a.fail(e.ctx, own, `container "c0"`, errors.New("cannot be realised"))
	if got := e.get("y"); got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseFailed || got.Annotations[api.BindFailureAnnotation] != "cannot be realised" {
		t.Errorf("its own pod: %v", got.Annotations)
	}
}

// TestCDIOffGivesNoGPU: a CUDA image sets NVIDIA_VISIBLE_DEVICES=all. On a runtime that
// applies CDI the container sees exactly its own MIG device (the spec's variable replaces
// Allocate's void, which replaced the image's all); on one that ignores the CDI names it sees
// void: no GPU, never every GPU of the node nor another pod's.
func TestCDIOffGivesNoGPU(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	on, err := e.startOn(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := api.DecodeMigReservations(e.get("p").Annotations[api.MigReservationsAnnotation])
	if on[cdi.VisibleDevicesEnv] != recs[0].MigUUID {
		t.Errorf("CDI on: %s=%q, want its MIG UUID %s", cdi.VisibleDevicesEnv, on[cdi.VisibleDevicesEnv], recs[0].MigUUID)
	}
	off, err := e.startOn(ids, false)
	if err != nil {
		t.Fatal(err)
	}
	if off[cdi.VisibleDevicesEnv] != cdi.NoDevices {
		t.Errorf("CDI off: %s=%q, want %s", cdi.VisibleDevicesEnv, off[cdi.VisibleDevicesEnv], cdi.NoDevices)
	}
}

// TestLostGPUAtAContainerRestart: the GPU falls off the bus while its pod runs and the
// container restarts. NVML's failure is no sign of tampering: the kubelet retries, the pod
// is neither failed nor evicted, and once NVML answers again the container gets its
// instance back. Only a GPU not on the node, a profile it lacks or an illegal placement
// are final.
func TestLostGPUAtAContainerRestart(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	first, err := e.start(ids)
	if err != nil {
		t.Fatal(err)
	}
	e.sim.LoseGPU(0)
	if _, err := e.start(ids); err == nil || !strings.Contains(err.Error(), "GPU_IS_LOST") {
		t.Fatalf("want the lost GPU's NVML error: %v", err)
	}
	if e.gaveUp("p") || e.get("p").Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed {
		t.Fatal("a lost GPU at a container restart failed the pod")
	}
	e.sim.RecoverGPU(0)
	again, err := e.start(ids)
	if err != nil || again["NVIDIA_VISIBLE_DEVICES"] != first["NVIDIA_VISIBLE_DEVICES"] {
		t.Fatalf("after the GPU is back: %v %v", again, err)
	}
	// A profile the GPU does not have is final.
	bad := e.pod("bad", pls(at(0, 1)))
	recs, _ := api.DecodeMigReservations(bad.Annotations[api.MigReservationsAnnotation])
	recs[0].Profile = "1g.10gb"
	raw, _ := api.EncodeMigReservations(recs)
	bad.Annotations[api.MigReservationsAnnotation] = raw
	bad.Name, bad.UID = "bad2", "uid-bad2"
	e.create(bad)
	if _, err := e.start(e.admit(bad, "c0", 1)); err == nil || !e.gaveUp("bad2") {
		t.Errorf("a profile the GPU lacks must fail the pod: %v", err)
	}
}

// specNames lists the CDI spec files in the test's spec directory.
func (e *env) specNames() []string {
	entries, err := os.ReadDir(e.cdiDir)
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	return names
}

// TestSpecsLiveAsLongAsTheirContainer: a device ID's CDI spec never outlives its container.
// The next holder of p's IDs is refused: no spec names p's MIG device then. Once no
// container holds an ID (the kubelet no longer lists it) the sweep removes its spec, MIG
// and hami-core alike, and leaves every held ID's spec and other nodes' and vendors' specs.
func TestSpecsLiveAsLongAsTheirContainer(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(0, 2)))
	ids := e.admit(p, "c0", 1)
	if _, err := e.start(ids); err != nil {
		t.Fatal(err)
	}
	kept := e.pod("kept", pls(at(4, 4)))
	keptIDs := e.admit(kept, "c0", 1)
	if _, err := e.start(keptIDs); err != nil {
		t.Fatal(err)
	}
	// p ends; the kubelet gives its ID to q, whose reservation is not signed for it.
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	q := e.pod("q", pls(at(2, 2)))
	q.Annotations[api.MigReservationsAnnotation] = strings.Replace(q.Annotations[api.MigReservationsAnnotation], `"start":2`, `"start":0`, 1)
	if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	delete(e.owners, ids[0])
	e.owners[ids[0]] = podresources.Owner{Namespace: "default", Pod: "q", Container: "c0"}
	if err := e.a.PreStartContainer(e.ctx, ids); err == nil {
		t.Fatal("q's tampered reservation must be refused")
	}
	if slices.Contains(e.specNames(), e.a.opts.Specs.FileName(node, ids[0])) {
		t.Errorf("after q's refusal the spec of %s still names p's device", ids[0])
	}
	// A hami-core share's spec, another node's and another vendor's.
	if err := e.a.opts.Specs.Write(node, "GPU-x::share-9", cdi.Edits(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"A": "b"}})); err != nil {
		t.Fatal(err)
	}
	if err := e.a.opts.Specs.Write("other-node", "GPU-x::1", cdi.Edits(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"A": "b"}})); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.cdiDir, "nvidia.com-gpu.yaml"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	delete(e.owners, ids[0]) // q was deleted too: nothing holds the ID
	if err := e.a.SweepSpecs(e.ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{e.a.opts.Specs.FileName("other-node", "GPU-x::1"), e.a.opts.Specs.FileName(node, keptIDs[0]), "nvidia.com-gpu.yaml"}
	slices.Sort(want)
	if got := e.specNames(); !slices.Equal(got, want) {
		t.Errorf("after the sweep: %v, want %v", got, want)
	}
	if _, err := e.start(keptIDs); err != nil {
		t.Errorf("a held ID's container restarts: %v", err)
	}
}

// TestRetiredKeyAdoptsWhatTheCheckpointRecords: the signing key is rotated and the old
// public key retired while a pod signed with it runs. Its container restarts (or the node
// reboots): the instance the checkpoint records for this pod UID at exactly the reserved
// placements was verified when it was made, so it is adopted (or made again) without the
// retired key. A reservation that differs from the record, or a pod with no record, still
// needs an accepted key.
func TestRetiredKeyAdoptsWhatTheCheckpointRecords(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	first, err := e.start(ids)
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	e.a.opts.Verifier = signing.NewStaticVerifier(newKey.Public().(ed25519.PublicKey)) // the old key retired
	again, err := e.start(ids)
	if err != nil || again["NVIDIA_VISIBLE_DEVICES"] != first["NVIDIA_VISIBLE_DEVICES"] || e.gaveUp("p") {
		t.Fatalf("a restart under a retired key: %v %v (evicted %v)", again, err, e.gaveUp("p"))
	}
	// The node reboots: the instance is gone, restart recovery keeps the live pod's record,
	// and the instance is made again at the recorded placement.
	if err := e.sim.LoseGpuInstance(0, e.gis()[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Recover(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ids); err != nil || len(e.gis()) != 1 || e.gaveUp("p") {
		t.Fatalf("a reboot under a retired key: %v %+v", err, e.gis())
	}
	// No record for this pod: the retired key is refused.
	other := e.admit(e.pod("other", pls(at(4, 4))), "c0", 1)
	if _, err := e.start(other); err == nil || !strings.Contains(err.Error(), "not in ConfigMap") || !e.gaveUp("other") {
		t.Errorf("a pod the checkpoint does not record, under a retired key: %v", err)
	}
	// A reservation that differs from the record is refused too.
	p := e.get("p")
	p.Annotations[api.MigReservationsAnnotation] = strings.Replace(p.Annotations[api.MigReservationsAnnotation], `"start":0`, `"start":2`, 1)
	if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ids); err == nil || !e.gaveUp("p") {
		t.Errorf("a reservation changed since it was recorded, under a retired key: %v", err)
	}
}

// TestNoSpecAfterTheKubeletsDeadline: a PreStart (here a restart adopting its instance) that
// outlived the kubelet's deadline writes no CDI spec, and the refusal removes the old one.
func TestNoSpecAfterTheKubeletsDeadline(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	if _, err := e.start(ids); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	cancel() // the kubelet's deadline passed while the adopt ran
	if err := e.a.PreStartContainer(ctx, ids); err == nil || !strings.Contains(err.Error(), "not writing the CDI specs") {
		t.Fatalf("want the late call refused: %v", err)
	}
	if names := e.specNames(); len(names) != 0 {
		t.Errorf("specs after a late call: %v", names)
	}
	if _, err := e.start(ids); err != nil {
		t.Errorf("the kubelet's retry: %v", err)
	}
}

// TestWaitForAVictimLeavesTheGPUFree: while a preemptor waits for its victim's instance to
// go, the GPU's other containers start (and reclaim runs) without waiting for it.
func TestWaitForAVictimLeavesTheGPUFree(t *testing.T) {
	e := newEnv(t)
	e.a.opts.PreemptionWait = 3 * time.Second
	if _, err := e.start(e.admit(e.pod("victim", pls(at(0, 4))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	v := e.get("victim")
	v.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if err := e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), v, "default"); err != nil {
		t.Fatal(err)
	}
	preemptor := e.admit(e.pod("preemptor", pls(at(0, 2))), "c0", 1)
	other := e.admit(e.pod("other", pls(at(4, 4))), "c0", 1)
	waited := make(chan error, 1)
	go func() { _, err := e.start(preemptor); waited <- err }()
	time.Sleep(200 * time.Millisecond) // the preemptor is waiting
	begin := time.Now()
	if _, err := e.start(other); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > time.Second {
		t.Errorf("another container of the GPU waited %s for the preemptor's wait", took)
	}
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "going away") {
		t.Errorf("the preemptor's wait: %v", err)
	}
}
