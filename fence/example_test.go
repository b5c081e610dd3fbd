package fence_test

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/fence"
)

// accept is the rule a downstream system applies: a write is accepted only
// from the newest token it has seen, and a newer token replaces the stored one.
func accept(highest *fence.Token, incoming fence.Token) bool {
	switch {
	case incoming.Generation > highest.Generation:
		*highest = incoming
		return true
	case incoming == *highest:
		return true
	default:
		return false
	}
}

// A downstream system keeps the highest token it accepted and rejects writes
// from older owners.
func Example() {
	old := fence.Token{Generation: 7, Owner: uuid.MustParse("5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11")}
	header := fence.Token{Generation: 8, Owner: uuid.MustParse("0b6a3f4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b")}.String()

	var highest fence.Token
	fmt.Println("old owner writes:", accept(&highest, old))
	current, err := fence.Parse(header)
	if err != nil {
		panic(err)
	}
	fmt.Println("new owner writes:", accept(&highest, current))
	fmt.Println("old owner wakes up and writes:", accept(&highest, old))
	fmt.Println("header:", header)
	// Output:
	// old owner writes: true
	// new owner writes: true
	// old owner wakes up and writes: false
	// header: 8.0b6a3f4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b
}
