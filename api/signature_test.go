package api

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
)

// TestSigningMessageSeparatesFields: moving bytes from one field to the next changes the
// message, so a signature for one (pod, node) cannot serve another.
func TestSigningMessageSeparatesFields(t *testing.T) {
	a := SigningMessage("uid-1", "node-a", MigReservationsAnnotation, "[]")
	for _, b := range [][]byte{
		SigningMessage("uid-1node-a", "", MigReservationsAnnotation, "[]"),
		SigningMessage("uid-1", "node-", "a"+MigReservationsAnnotation, "[]"),
		SigningMessage("uid-1", "node-a", DevicesAllocatedAnnotation, "[]"),
	} {
		if bytes.Equal(a, b) {
			t.Errorf("equal messages for different fields: %q", b)
		}
	}
}

func TestSignReservation(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	ann := map[string]string{MigReservationsAnnotation: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":6,"size":1}}]`}
	if err := SignReservation(priv, "uid-1", "node-a", ann); err != nil {
		t.Fatal(err)
	}
	id, sig, err := ParseSignature(ann[ReservationSignatureAnnotation])
	if err != nil || id != KeyID(priv.Public().(ed25519.PublicKey)) {
		t.Fatalf("key id %q, %v", id, err)
	}
	key, value, _ := SignedPayload(ann)
	if !ed25519.Verify(priv.Public().(ed25519.PublicKey), SigningMessage("uid-1", "node-a", key, value), sig) {
		t.Error("signature does not verify")
	}
	if err := SignReservation(priv, "uid-1", "node-a", map[string]string{}); err == nil || !strings.Contains(err.Error(), "no reservation to sign") {
		t.Errorf("nothing to sign: %v", err)
	}
	bad := map[string]string{MigReservationsAnnotation: `[{"containerIndex":-1}]`}
	if err := SignReservation(priv, "uid-1", "node-a", bad); err == nil {
		t.Error("an invalid reservation was signed")
	}
}

func TestParseSignatureErrors(t *testing.T) {
	for _, v := range []string{"", "ed25519", "ed25519:id", "rsa:id:AAAA", "ed25519:id:!!!", "ed25519:id:AAAA", "ed25519:a:b:c"} {
		if _, _, err := ParseSignature(v); err == nil || !strings.Contains(err.Error(), ReservationSignatureAnnotation) {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// FuzzParseSignature: any annotation value parses or is refused naming the annotation, and
// what parses has a full-length signature.
func FuzzParseSignature(f *testing.F) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	ann := map[string]string{DevicesAllocatedAnnotation: "GPU-1,NVIDIA,1000,10:;"}
	_ = SignReservation(priv, "u", "n", ann)
	f.Add(ann[ReservationSignatureAnnotation])
	f.Add("ed25519::")
	f.Fuzz(func(t *testing.T, v string) {
		_, sig, err := ParseSignature(v)
		if err != nil {
			if !strings.Contains(err.Error(), ReservationSignatureAnnotation) {
				t.Fatalf("error names no annotation: %v", err)
			}
			return
		}
		if len(sig) != ed25519.SignatureSize {
			t.Fatalf("accepted a %d-byte signature", len(sig))
		}
	})
}
