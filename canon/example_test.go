package canon_test

import (
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/oncekey/oncekey/canon"
)

func ExampleJSON() {
	out, err := canon.JSON([]byte(`{"b": [1.50, 1e21, -0], "a": "\u00e9\n", "\ud83d\ude00": 1, "\uff21": 2}`))
	if err != nil {
		panic(err)
	}
	// U+FF21 sorts after U+1F600: its UTF-16 code unit is greater than the
	// emoji's high surrogate, although its UTF-8 bytes are smaller.
	fmt.Println(string(out))
	// Output: {"a":"é\n","b":[1.5,1e+21,0],"😀":1,"Ａ":2}
}

func ExampleRequest() {
	opts := canon.Options{
		Operation: "orders.create",
		Headers:   []string{"Content-Language"},
		Exclude:   []string{"/client_ts"},
	}
	first := httptest.NewRequest("POST", "/v1/orders?x=1&y=2",
		strings.NewReader(`{"amount": 1250, "currency": "EUR", "client_ts": "10:00"}`))
	first.Header.Set("Content-Type", "application/json")
	first.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")

	retry := httptest.NewRequest("POST", "/v1/orders?y=2&x=1",
		strings.NewReader(`{"currency":"EUR","client_ts":"10:01","amount":1.25e3}`))
	retry.Header.Set("Content-Type", "application/json")

	a, _ := canon.Request(first, opts)
	b, _ := canon.Request(retry, opts)
	fmt.Println(a.Version(), a == b)

	// The handler still reads the body as sent.
	body, _ := io.ReadAll(retry.Body)
	fmt.Println(string(body))

	// Integers a double cannot hold are rejected: send them as strings.
	big := httptest.NewRequest("POST", "/v1/accounts", strings.NewReader(`{"id": 9007199254740993}`))
	big.Header.Set("Content-Type", "application/json")
	_, err := canon.Request(big, opts)
	fmt.Println(errors.Is(err, canon.ErrInvalid))
	// Output:
	// v1 true
	// {"currency":"EUR","client_ts":"10:01","amount":1.25e3}
	// true
}

func ExampleSum() {
	// Fingerprinting a JSON payload that does not arrive over HTTP, such as
	// a queue message.
	payload, err := canon.JSONStrict([]byte(`{"to": "acct_1", "amount": 10}`))
	if err != nil {
		panic(err)
	}
	fp := canon.Sum([]byte("transfers.create"), payload)
	same := canon.Sum([]byte("transfers.create"), []byte(`{"amount":10,"to":"acct_1"}`))
	fmt.Println(len(fp), fp == same)
	// Output: 46 true
}
