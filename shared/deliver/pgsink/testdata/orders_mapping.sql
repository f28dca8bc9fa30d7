CREATE TABLE IF NOT EXISTS "app"."orders" (
    "doc_id"        text NOT NULL,
    "order_no"      bigint NOT NULL,
    "status"        text,
    "customer_id"   uuid,
    "customer_name" text,
    "placed_at"     timestamptz,
    "paid"          boolean,
    "tags"          jsonb,
    PRIMARY KEY ("order_no")
);

CREATE INDEX IF NOT EXISTS "orders_doc_id_idx" ON "app"."orders" ("doc_id");

CREATE TABLE IF NOT EXISTS "app"."order_items" (
    "doc_id"     text NOT NULL,
    "order_no"   bigint NOT NULL,
    "line"       integer NOT NULL,
    "sku"        text NOT NULL,
    "qty"        integer,
    "unit_price" numeric,
    "currency"   text,
    PRIMARY KEY ("order_no", "line")
);

CREATE INDEX IF NOT EXISTS "order_items_doc_id_idx" ON "app"."order_items" ("doc_id");

CREATE TABLE IF NOT EXISTS "app"."order_totals" (
    "doc_id"   text NOT NULL,
    "subtotal" numeric,
    "tax"      numeric,
    "total"    numeric NOT NULL,
    "currency" text,
    PRIMARY KEY ("doc_id")
);

CREATE TABLE IF NOT EXISTS "app"."shop_versions" (
    doc_id     text PRIMARY KEY,
    generation bigint NOT NULL,
    counter    bigint NOT NULL,
    rev        text NOT NULL,
    deleted    boolean NOT NULL,
    filtered   boolean NOT NULL DEFAULT false,
    seq        text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS "app"."shop_data_quality" (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    output      text NOT NULL,
    doc_id      text NOT NULL,
    rev         text NOT NULL,
    generation  bigint NOT NULL,
    counter     bigint NOT NULL,
    column_name text NOT NULL,
    path        text NOT NULL,
    original    jsonb NOT NULL,
    stored      text,
    reason      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
