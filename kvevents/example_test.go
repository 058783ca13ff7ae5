package kvevents_test

import (
	"encoding/hex"
	"fmt"

	"github.com/kvindex/kvindex/kvevents"
)

func Example() {
	// Golden payload A1 (testdata/golden.txt, walked byte by byte in the package
	// documentation): a vLLM BlockStored of two 4-token blocks, positional encoding.
	payload, _ := hex.DecodeString("93cb41da13b8601000009198ab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708" +
		"cf112233445566778898ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0a3475055c000")

	dec, err := kvevents.New(kvevents.Config{BlockSize: 4})
	if err != nil {
		panic(err)
	}
	var batch kvevents.Batch // reused for every payload of this subscriber
	if err := dec.Decode(payload, &batch); err != nil {
		fmt.Println("drop payload:", err)
		return
	}
	for _, ev := range batch.Events {
		fmt.Printf("%s rank=%d parent=%#x medium=%s namespace=%q\n", ev.Kind, ev.DPRank, ev.Parent, ev.Medium, ev.Namespace)
		for i := range ev.Seqs {
			fmt.Printf("  seq=%#016x content=%#016x\n", ev.Seqs[i], ev.Contents[i])
		}
	}
	fmt.Println("rejected:", batch.RejectedCount, "unknown:", batch.UnknownTypes)

	// A truncated payload fails as a whole.
	err = dec.Decode(payload[:40], &batch)
	fmt.Println(err != nil, len(batch.Events))
	// Output:
	// stored rank=0 parent=0x1122334455667788 medium=GPU namespace=""
	//   seq=0x8899aabbccddeeff content=0xd704a398f1997a4d
	//   seq=0x0102030405060708 content=0x1d7f87cc0d95633c
	// rejected: 0 unknown: 0
	// true 0
}
