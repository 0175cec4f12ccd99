package faults

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/signing"
)

// TestFailSafe injects the faults of a real node that once hurt running pods (issue 25), a
// node each, and checks the invariants after each; docs/reliability.md lists the mutation
// that makes each fail.
func TestFailSafe(t *testing.T) {
	const a100 = "A100-40GB"
	w := start(t, mig("lag", a100), mig("lost", a100), mig("half", a100), mig("xid", a100, a100), mig("rotate", a100))

	// Pod x ends and is recreated under its name while the node's device plugin cannot read
	// the API (its informer shows the old x, realised): the new x's container never starts
	// on the old x's instance; once the API is back it gets its own, and the old one goes.
	t.Run("pod recreated under its name while the informer lags", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("x", "lag", 19000))
		old := w.running("x", 60*time.Second)
		t.Cleanup(func() { _ = w.SB.CutAPI("lag", false) })
		if err := w.SB.CutAPI("lag", true); err != nil {
			t.Fatal(err)
		}
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, "x", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the old x gone", 60*time.Second, func() (bool, string) {
			_, err := w.C.CoreV1().Pods("default").Get(w.Ctx, "x", metav1.GetOptions{})
			return err != nil, "still there"
		})
		recreated := pod("x", "lag", 9000)
		w.Create(recreated)
		time.Sleep(10 * time.Second) // the kubelet tries to start the new x meanwhile
		if p := w.Get("x"); p.Status.Phase == v1.PodRunning {
			t.Fatal("the recreated x runs while its node's device plugin cannot tell it from the old x")
		}
		_ = w.SB.CutAPI("lag", false)
		r := w.running("x", 120*time.Second)
		if r.MigUUID == old.MigUUID || r.Profile == old.Profile {
			t.Errorf("the recreated x runs on %s (%s), the old x's was %s (%s)", r.MigUUID, r.Profile, old.MigUUID, old.Profile)
		}
		w.settled()
		w.done("x")
	})

	// The GPU falls off the bus and the pod's container restarts meanwhile: NVML's failure
	// is retried, never called tampering; the pod is neither failed nor evicted, and its
	// container runs again on the same instance once the GPU is back.
	t.Run("GPU lost at a container restart", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("restarts", "lost", 9000))
		r := w.running("restarts", 60*time.Second)
		gpus := w.SB.GPUs("lost")
		gpus.LoseGPU(0)
		t.Cleanup(func() { gpus.RecoverGPU(0) })
		if err := w.SB.FinishPod(w.Ctx, "default", "restarts", false); err != nil {
			t.Fatal(err)
		}
		w.event("restarts", "RealisationFailed", "GPU_IS_LOST")
		if p := w.Get("restarts"); p.DeletionTimestamp != nil || p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed {
			t.Fatalf("a lost GPU at a container restart gave the pod up: %v", p.Annotations)
		}
		gpus.RecoverGPU(0)
		w.WaitFor("the container running again", 120*time.Second, func() (bool, string) {
			p := w.Get("restarts")
			ready := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > 0 && p.Status.ContainerStatuses[0].State.Running != nil
			return ready, fmt.Sprint(p.Status.ContainerStatuses)
		})
		if again := w.running("restarts", 10*time.Second); again.MigUUID != r.MigUUID {
			t.Errorf("the restarted container got %s, want its instance %s", again.MigUUID, r.MigUUID)
		}
		w.settled()
		w.done("restarts")
	})

	// Reclaim destroys an ended pod's compute instance and fails on its GPU instance: what
	// is left is the entry's own, destroyed by the next pass, never forgotten; the next pod
	// reserved at that placement runs.
	t.Run("half-destroyed instance", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("whole-gpu", "half", 40000))
		w.running("whole-gpu", 60*time.Second)
		w.SB.GPUs("half").FailNext(0, sim.OpDestroyGpuInstance, nvml.ErrorUnknown)
		w.done("whole-gpu")
		w.Create(pod("next", "half", 40000))
		w.running("next", 120*time.Second)
		if p := w.Get("next"); p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
			t.Errorf("next: %v", p.Annotations)
		}
		w.settled()
		w.done("next")
	})

	// The signing key is rotated and the old public key retired at once while a pod signed
	// with it runs: its container restarts, then its node reboots, and it keeps running on
	// the instance the checkpoint records (made again at the same placement after the
	// reboot), never evicted; a new pod is signed with the new key and runs.
	t.Run("key rotation with restarts", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("signed-old", "rotate", 19000))
		r := w.running("signed-old", 60*time.Second)
		oldID := signatureKey(t, w.Get("signed-old"))
		if err := rotateKey(w.Ctx, w); err != nil {
			t.Fatal(err)
		}
		if err := w.SB.FinishPod(w.Ctx, "default", "signed-old", false); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the container restarted on its instance", 120*time.Second, func() (bool, string) {
			p := w.Get("signed-old")
			ok := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > 0 && p.Status.ContainerStatuses[0].State.Running != nil
			return ok, fmt.Sprint(p.Status.ContainerStatuses, w.LastEvent(p))
		})
		if again := w.running("signed-old", 10*time.Second); again.MigUUID != r.MigUUID {
			t.Errorf("after the restart: %s, want %s", again.MigUUID, r.MigUUID)
		}
		if err := w.SB.RebootNode(w.Ctx, "rotate"); err != nil {
			t.Fatal(err)
		}
		w.WaitFor("the pod running again after the reboot", 120*time.Second, func() (bool, string) {
			p := w.Get("signed-old")
			recs, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
			ok := err == nil && len(recs) == 1 && recs[0].Realized() && recs[0].MigUUID != r.MigUUID && recs[0].Placement == r.Placement && p.Status.Phase == v1.PodRunning
			return ok, fmt.Sprint(recs, err, p.Status.Phase, w.LastEvent(p))
		})
		if p := w.Get("signed-old"); p.DeletionTimestamp != nil || p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed || signatureKey(t, p) != oldID {
			t.Fatalf("the old-key pod was given up: %v", p.Annotations)
		}
		w.Create(pod("signed-new", "rotate", 9000))
		w.running("signed-new", 90*time.Second)
		if id := signatureKey(t, w.Get("signed-new")); id == oldID {
			t.Errorf("the new pod is signed with the retired key %s", id)
		}
		w.settled()
		w.done("signed-old", "signed-new")
	})

	// XID 79 on a GPU with a pod on it: the GPU goes unhealthy (the kubelet offers none of
	// its devices, the inventory says so, Warning events on the node and the pod), a new
	// pod goes to the node's other GPU, the running pod is left alone; healthy again once
	// NVML needs no reset.
	t.Run("XID", func(t *testing.T) {
		w := &world{w.For(t)}
		w.Create(pod("on-xid", "xid", 40000))
		r := w.running("on-xid", 60*time.Second)
		gpus := w.SB.GPUs("xid")
		bad := 0
		for _, g := range gpus.Snapshot() {
			if g.UUID == r.GPUUUID {
				bad = g.Index
			}
		}
		gpus.SetResetPending(bad, true)
		t.Cleanup(func() { gpus.SetResetPending(bad, false) })
		gpus.InjectXID(bad, 79, -1, -1)
		w.event("on-xid", "GPUUnhealthy", "XID 79")
		w.WaitFor("the GPU published unhealthy", 60*time.Second, func() (bool, string) {
			n, err := w.C.CoreV1().Nodes().Get(w.Ctx, "xid", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			gpusInv, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
			for _, g := range gpusInv {
				if g.ID == r.GPUUUID && !g.Health {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%v %v", gpusInv, err)
		})
		w.Create(pod("after-xid", "xid", 40000))
		if a := w.running("after-xid", 90*time.Second); a.GPUUUID == r.GPUUUID {
			t.Errorf("a new pod was placed on the unhealthy GPU %s", a.GPUUUID)
		}
		if again := w.running("on-xid", 10*time.Second); again.MigUUID != r.MigUUID {
			t.Errorf("the running pod was touched: %+v", again)
		}
		gpus.SetResetPending(bad, false)
		w.WaitFor("the GPU healthy again", 90*time.Second, func() (bool, string) {
			evs, err := w.C.CoreV1().Events("").List(w.Ctx, metav1.ListOptions{FieldSelector: "reason=GPUHealthy,involvedObject.name=xid"})
			return err == nil && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, r.GPUUUID), fmt.Sprint(err)
		})
		w.settled()
		w.done("on-xid", "after-xid")
	})
}

// signatureKey is the id of the key that signed the pod's reservation.
func signatureKey(t *testing.T, p *v1.Pod) string {
	t.Helper()
	id, _, err := api.ParseSignature(p.Annotations[api.ReservationSignatureAnnotation])
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return id
}

// rotateKey does docs/operations.md's rotation with the old public key retired at once: a
// new private key in the Secret, its public key the only one in the ConfigMap, the
// scheduler restarted; it waits until the device plugins can have seen the ConfigMap.
func rotateKey(ctx context.Context, w *world) error {
	key, err := signing.GenerateKey()
	if err != nil {
		return err
	}
	priv, err := signing.EncodePrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := signing.EncodePublicKey(key.Public().(ed25519.PublicKey))
	if err != nil {
		return err
	}
	secret, err := w.C.CoreV1().Secrets(api.DefaultSigningKeyNamespace).Get(ctx, api.SigningKeySecretName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	secret.Data[api.SigningKeySecretKey] = priv
	if _, err := w.C.CoreV1().Secrets(secret.Namespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return err
	}
	cm, err := w.C.CoreV1().ConfigMaps(api.DefaultSystemNamespace).Get(ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cm.Data = map[string]string{api.KeyID(key.Public().(ed25519.PublicKey)) + api.PublicKeySuffix: string(pub)}
	if _, err := w.C.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if err := w.SB.RestartScheduler(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the device plugins' ConfigMap watch
	return nil
}
