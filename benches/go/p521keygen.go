// Command p521keygen makes n ECDSA P-521 keys with Go's crypto/ecdsa, as Kubeflow Trainer makes
// an MPI job's SSH key, and prints the nanoseconds the n took: benches/policy.rs times it beside
// mpi-webhook's key generation in the same run (docs/benchmarks.md "Key generation").
//
// With -encode, each key is also encoded as the Secret stores it: SEC1 PEM, as Trainer does, and
// the OpenSSH public line (by hand here, as x/crypto/ssh writes it: only the standard library is
// at hand).
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"flag"
	"fmt"
	"time"
)

func keyPair(encode bool) {
	key, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil || !encode {
		check(err)
		return
	}
	der, err := x509.MarshalECPrivateKey(key)
	check(err)
	_ = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	public, err := key.PublicKey.ECDH()
	check(err)
	var wire []byte
	for _, field := range [][]byte{[]byte("ecdsa-sha2-nistp521"), []byte("nistp521"), public.Bytes()} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(field)))
		wire = append(wire, field...)
	}
	_ = "ecdsa-sha2-nistp521 " + base64.StdEncoding.EncodeToString(wire) + "\n"
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	n := flag.Uint64("n", 1, "keys to make")
	encode := flag.Bool("encode", false, "also encode each key as the Secret stores it")
	flag.Parse()
	keyPair(*encode) // warm up, untimed
	start := time.Now()
	for i := uint64(0); i < *n; i++ {
		keyPair(*encode)
	}
	fmt.Println(time.Since(start).Nanoseconds())
}
