package signing

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dynamig/dynamig/api"
)

const (
	ns       = "dynamig-system"
	secretNS = "dynamig-signing"
)

func mustKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func publicPEM(t *testing.T, k ed25519.PrivateKey) string {
	t.Helper()
	b, err := EncodePublicKey(k.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLoadSigningKey(t *testing.T) {
	ctx := context.Background()
	t.Run("created once, then read", func(t *testing.T) {
		client := fake.NewClientset()
		first, err := LoadSigningKey(ctx, client, secretNS, ns, true)
		if err != nil {
			t.Fatal(err)
		}
		again, err := LoadSigningKey(ctx, client, secretNS, ns, true)
		if err != nil {
			t.Fatal(err)
		}
		if !first.Equal(again) {
			t.Error("a second start made another key")
		}
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := PublicKeys(cm)
		if err != nil || len(keys) != 1 || !keys[api.KeyID(first.Public().(ed25519.PublicKey))].Equal(first.Public()) {
			t.Errorf("published %v, %v", keys, err)
		}
	})
	t.Run("missing and not to be created", func(t *testing.T) {
		_, err := LoadSigningKey(ctx, fake.NewClientset(), secretNS, ns, false)
		if err == nil || !strings.Contains(err.Error(), "Secret dynamig-signing/dynamig-signing-key does not exist") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("an operator's key is kept and published beside the old one", func(t *testing.T) {
		old, mine := mustKey(t), mustKey(t)
		data, _ := EncodePrivateKey(mine)
		oldID := api.KeyID(old.Public().(ed25519.PublicKey))
		client := fake.NewClientset(
			&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: api.SigningKeySecretName, Namespace: secretNS}, Data: map[string][]byte{api.SigningKeySecretKey: data}},
			&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: api.PublicKeysConfigMapName, Namespace: ns}, Data: map[string]string{oldID + ".pem": publicPEM(t, old)}},
		)
		got, err := LoadSigningKey(ctx, client, secretNS, ns, true)
		if err != nil || !got.Equal(mine) {
			t.Fatalf("got %v", err)
		}
		cm, _ := client.CoreV1().ConfigMaps(ns).Get(ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
		if keys, err := PublicKeys(cm); err != nil || len(keys) != 2 {
			t.Errorf("want the old and the new key, got %v, %v", keys, err)
		}
	})
	t.Run("unreadable secret", func(t *testing.T) {
		client := fake.NewClientset(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: api.SigningKeySecretName, Namespace: secretNS}, Data: map[string][]byte{api.SigningKeySecretKey: []byte("junk")}})
		_, err := LoadSigningKey(ctx, client, secretNS, ns, true)
		if err == nil || !strings.Contains(err.Error(), "Secret dynamig-signing/dynamig-signing-key, key private.pem") {
			t.Errorf("got %v", err)
		}
	})
}

func TestPublicKeys(t *testing.T) {
	k := mustKey(t)
	id := api.KeyID(k.Public().(ed25519.PublicKey))
	for _, tc := range []struct {
		name    string
		data    map[string]string
		want    int
		wantErr string
	}{
		{"one", map[string]string{id + ".pem": publicPEM(t, k)}, 1, ""},
		{"other entries ignored", map[string]string{id + ".pem": publicPEM(t, k), "README": "x"}, 1, ""},
		{"filed under another id", map[string]string{"0011223344556677.pem": publicPEM(t, k)}, 0, "entry 0011223344556677.pem holds key " + id},
		{"not a key", map[string]string{"x.pem": "junk"}, 0, "entry x.pem: not a PEM block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := PublicKeys(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "keys", Namespace: ns}, Data: tc.data})
			if len(keys) != tc.want || (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("keys %v, error %v; want %d keys, error %q", keys, err, tc.want, tc.wantErr)
			}
		})
	}
}

func signedPod(t *testing.T, k ed25519.PrivateKey, uid, node string, annotations map[string]string) *v1.Pod {
	t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1", Annotations: map[string]string{}}, Spec: v1.PodSpec{NodeName: "node-a"}}
	for k, v := range annotations {
		p.Annotations[k] = v
	}
	if err := api.SignReservation(k, uid, node, p.Annotations); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVerify(t *testing.T) {
	k, other := mustKey(t), mustKey(t)
	v := NewStaticVerifier(k.Public().(ed25519.PublicKey))
	mig := `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":0,"size":2}}]`
	realised := `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"2g.10gb","placement":{"start":0,"size":2},"migUUID":"MIG-1","gpuInstanceID":3,"computeInstanceID":0}]`
	core := `GPU-1,NVIDIA,8000,30:;`
	for _, tc := range []struct {
		name    string
		pod     func() *v1.Pod
		wantErr string
	}{
		{"mig", func() *v1.Pod {
			return signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
		}, ""},
		{"mig, realised since", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
			p.Annotations[api.MigReservationsAnnotation] = realised
			return p
		}, ""},
		{"hami-core", func() *v1.Pod {
			return signedPod(t, k, "u1", "node-a", map[string]string{api.DevicesAllocatedAnnotation: core, api.DevicesToAllocateAnnotation: core})
		}, ""},
		{"unsigned", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
			delete(p.Annotations, api.ReservationSignatureAnnotation)
			return p
		}, "pod default/p carries no dynamig.io/reservation-signature"},
		{"tampered placement", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
			p.Annotations[api.MigReservationsAnnotation] = strings.Replace(mig, `"start":0`, `"start":2`, 1)
			return p
		}, "does not match its reservation on node node-a"},
		{"tampered hami-core", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.DevicesAllocatedAnnotation: core})
			p.Annotations[api.DevicesAllocatedAnnotation] = `GPU-1,NVIDIA,8000,100:;`
			return p
		}, "does not match"},
		{"another pod's signature", func() *v1.Pod {
			return signedPod(t, k, "u0", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
		}, "does not match"},
		{"signed for another node", func() *v1.Pod {
			return signedPod(t, k, "u1", "node-b", map[string]string{api.MigReservationsAnnotation: mig})
		}, "does not match"},
		{"wrong key", func() *v1.Pod {
			return signedPod(t, other, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
		},
			"signed by key " + api.KeyID(other.Public().(ed25519.PublicKey)) + ", which is not in ConfigMap"},
		{"garbled", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
			p.Annotations[api.ReservationSignatureAnnotation] = "rsa:x:y"
			return p
		}, `dynamig.io/reservation-signature is "rsa:x:y"`},
		{"short signature", func() *v1.Pod {
			p := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
			p.Annotations[api.ReservationSignatureAnnotation] = "ed25519:abc:AAAA"
			return p
		}, "is not 64 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Verify(tc.pod())
			if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestVerifierFollowsConfigMap: a key added to the ConfigMap is accepted once the informer
// sees it (rotation without restart); a removed one is refused.
func TestVerifierFollowsConfigMap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := mustKey(t)
	client := fake.NewClientset()
	v := NewVerifier(client, ns)
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mig := `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":6,"size":1}}]`
	pod := signedPod(t, k, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
	if err := v.Verify(pod); err == nil || !strings.Contains(err.Error(), "ConfigMap dynamig-system/dynamig-signing-public-keys does not exist") {
		t.Fatalf("before the ConfigMap: %v", err)
	}
	if _, err := LoadSigningKey(ctx, client, secretNS, ns, true); err != nil {
		t.Fatal(err)
	}
	s, _ := client.CoreV1().Secrets(secretNS).Get(ctx, api.SigningKeySecretName, metav1.GetOptions{})
	priv, _ := ParsePrivateKey(s.Data[api.SigningKeySecretKey])
	pod = signedPod(t, priv, "u1", "node-a", map[string]string{api.MigReservationsAnnotation: mig})
	eventually(t, func() error { return v.Verify(pod) })
	if err := client.CoreV1().ConfigMaps(ns).Delete(ctx, api.PublicKeysConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		if err := v.Verify(pod); err == nil {
			return context.DeadlineExceeded
		}
		return nil
	})
}

func eventually(t *testing.T, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatal(err)
}
