package api

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
)

// Signed reservations: the scheduler signs what it hands off (the pod UID, the node and the
// reservation it wrote) with an ed25519 key, and the device plugin creates nothing whose
// signature does not verify against one of the scheduler's public keys. The admission
// policies are the first line; the signature protects clusters where they are missing.
const (
	// ReservationSignatureAnnotation on a bound GPU pod: "ed25519:<key id>:<base64 signature>",
	// written by the scheduler on the Binding with the reservation.
	ReservationSignatureAnnotation = "dynamig.io/reservation-signature"
	// SigningKeySecretName is the Secret that holds the scheduler's private key (PKCS #8 PEM
	// under SigningKeySecretKey), in a namespace of its own (DefaultSigningKeyNamespace) so
	// that only the scheduler can read it: the webhook's certificate rotator lists every
	// Secret of the system namespace.
	SigningKeySecretName       = "dynamig-signing-key"
	DefaultSigningKeyNamespace = "dynamig-signing"
	SigningKeySecretKey        = "private.pem"
	// PublicKeysConfigMapName is the ConfigMap in the system namespace whose entries
	// "<key id>.pem" are the public keys (PKIX PEM) the device plugins accept. More than
	// one is accepted, so a key is rotated by adding the new public key first.
	PublicKeysConfigMapName = "dynamig-signing-public-keys"
	// PublicKeySuffix ends each public-key entry of PublicKeysConfigMapName.
	PublicKeySuffix = ".pem"

	signatureScheme = "ed25519"
	// signingContext starts every signed message, so a signature over a reservation can
	// never be taken for one over anything else.
	signingContext = "dynamig.io/reservation/v1"
)

// KeyID names a public key: the hex of the first 8 bytes of its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// SignedPayload is the part of a pod's annotations a signature covers: the reservation
// annotation's key and its value as the scheduler wrote it. For MIG that is the canonical
// encoding of the records without the runtime identity the device plugin adds later, so the
// signature still verifies after earlier containers were realised; for hami-core it is
// vgpu-devices-allocated, which the device plugin never changes.
func SignedPayload(annotations map[string]string) (key, value string, err error) {
	if raw, ok := annotations[MigReservationsAnnotation]; ok {
		recs, err := DecodeMigReservations(raw)
		if err != nil {
			return "", "", err
		}
		handed := make([]MigReservation, len(recs))
		for i, r := range recs {
			handed[i] = MigReservation{ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex, GPUUUID: r.GPUUUID, Profile: r.Profile, Placement: r.Placement}
		}
		value, err := EncodeMigReservations(handed)
		return MigReservationsAnnotation, value, err
	}
	if raw, ok := annotations[DevicesAllocatedAnnotation]; ok {
		return DevicesAllocatedAnnotation, raw, nil
	}
	return "", "", fmt.Errorf("no reservation to sign: neither %s nor %s is set", MigReservationsAnnotation, DevicesAllocatedAnnotation)
}

// SigningMessage is what a reservation signature covers. Each field is length-prefixed, so
// no field can run into the next.
func SigningMessage(podUID, node, key, value string) []byte {
	var b []byte
	for _, f := range []string{signingContext, podUID, node, key, value} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// SignReservation signs the reservation among a pod's annotations (SignedPayload) for the
// pod's UID and node, and sets ReservationSignatureAnnotation among them.
func SignReservation(priv ed25519.PrivateKey, podUID, node string, annotations map[string]string) error {
	key, value, err := SignedPayload(annotations)
	if err != nil {
		return err
	}
	annotations[ReservationSignatureAnnotation] = Signature(priv, podUID, node, key, value)
	return nil
}

// Signature is the ReservationSignatureAnnotation value signing a payload (SignedPayload's
// key and value) for the pod and node. A writer that has just encoded the payload (the
// scheduler's Bind: MIG records without runtime identity encode to exactly the signed
// value) signs it without SignReservation's decoding and encoding it again.
func Signature(priv ed25519.PrivateKey, podUID, node, key, value string) string {
	sig := ed25519.Sign(priv, SigningMessage(podUID, node, key, value))
	pub := priv.Public().(ed25519.PublicKey)
	return signatureScheme + ":" + KeyID(pub) + ":" + base64.StdEncoding.EncodeToString(sig)
}

// ParseSignature splits a ReservationSignatureAnnotation value into key id and signature.
func ParseSignature(v string) (keyID string, sig []byte, err error) {
	parts := strings.Split(v, ":")
	if len(parts) != 3 || parts[0] != signatureScheme {
		return "", nil, fmt.Errorf("%s is %q; want %s:<key id>:<base64 signature>", ReservationSignatureAnnotation, shorten(v), signatureScheme)
	}
	sig, err = base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "", nil, fmt.Errorf("%s: the signature of key %s is not %d bytes of base64", ReservationSignatureAnnotation, shorten(parts[1]), ed25519.SignatureSize)
	}
	return parts[1], sig, nil
}
