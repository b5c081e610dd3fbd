package canon_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
)

// Test bodies shaped like real API payloads: an order with customer,
// addresses, line items, metadata; members in struct (not sorted) order,
// decimals, large and small integers, escapes and non-ASCII text.

type address struct {
	Line1      string `json:"line1"`
	Line2      string `json:"line2,omitempty"`
	City       string `json:"city"`
	PostalCode string `json:"postal_code"`
	Country    string `json:"country"`
}

type item struct {
	SKU        string            `json:"sku"`
	Name       string            `json:"name"`
	Quantity   int               `json:"quantity"`
	UnitPrice  float64           `json:"unit_price"`
	Discount   float64           `json:"discount"`
	Taxable    bool              `json:"taxable"`
	Tags       []string          `json:"tags"`
	Attributes map[string]string `json:"attributes"`
	Weight     float64           `json:"weight_kg"`
	Note       *string           `json:"note"`
}

type order struct {
	Type     string  `json:"type"`
	ID       string  `json:"order_id"`
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
	Customer struct {
		ID      int64   `json:"id"`
		Email   string  `json:"email"`
		Name    string  `json:"name"`
		Billing address `json:"billing_address"`
	} `json:"customer"`
	Shipping address          `json:"shipping_address"`
	Items    []item           `json:"items"`
	Metadata map[string]any   `json:"metadata"`
	Created  string           `json:"created_at"`
	Flags    []bool           `json:"flags"`
	Ratios   []float64        `json:"ratios"`
	Extra    []map[string]any `json:"extra"`
}

var words = []string{"widget", "Größe", "café", "naïve", "東京", "emoji 😀", "tab\there", `quote"d`, "línea\nnueva", "plain", "ascii-only", "déjà vu"}

// realisticBody returns a deterministic order body of about size bytes.
func realisticBody(size int) []byte {
	r := rand.New(rand.NewPCG(uint64(size), 42))
	var o order
	o.Type = "order.create"
	o.ID = fmt.Sprintf("ord_%016x", r.Uint64())
	o.Currency = "EUR"
	o.Customer.ID = r.Int64N(1 << 52)
	o.Customer.Email = "jane.doe@example.com"
	o.Customer.Name = "Jane Doe-Müller"
	o.Customer.Billing = address{"1 Rue de la Paix", "Bâtiment B", "Paris", "75002", "FR"}
	o.Shipping = address{Line1: "221B Baker Street", City: "London", PostalCode: "NW1 6XE", Country: "GB"}
	o.Metadata = map[string]any{"channel": "web", "campaign": "spring-2026", "z_last": 1, "a_first": true, "nested": map[string]any{"k": "v", "n": 3.5}}
	o.Created = "2026-03-14T15:09:26.535Z"
	o.Flags = []bool{true, false, true}
	o.Ratios = []float64{0.1, 1e-7, 2.5e21, 1.0 / 3, 100}
	body, _ := json.Marshal(o)
	for i := 0; len(body) < size; i++ {
		it := item{
			SKU:       fmt.Sprintf("SKU-%06d", r.IntN(1000000)),
			Name:      words[r.IntN(len(words))] + " " + words[r.IntN(len(words))],
			Quantity:  1 + r.IntN(20),
			UnitPrice: float64(r.IntN(100000)) / 100,
			Discount:  r.Float64() / 4,
			Taxable:   r.IntN(2) == 0,
			Tags:      []string{words[r.IntN(len(words))], "tag"},
			Attributes: map[string]string{
				"color": "blue", "size": "XL", "Ω": "ohm", "material": words[r.IntN(len(words))],
			},
			Weight: float64(r.IntN(5000)) / 1000,
		}
		if i%3 == 0 {
			s := "gift wrap, please — merci"
			it.Note = &s
		}
		o.Items = append(o.Items, it)
		o.Amount += float64(it.Quantity) * it.UnitPrice
		if i%5 == 0 {
			o.Extra = append(o.Extra, map[string]any{"i": i, "big": 1e300, "neg": -0.000123, "s": "x"})
		}
		body, _ = json.Marshal(o)
	}
	return body
}
