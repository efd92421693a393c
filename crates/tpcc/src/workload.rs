//! A terminal's inputs (clauses 2.4.1, 2.5.1, 2.6.1, 2.7.1, 2.8.1 and the mix of
//! 5.2.3): which transaction runs next and with what arguments.

use crate::load::{CUSTOMERS, DISTRICTS, ITEMS};
use crate::random::{NuRandC, Random, last_name, nurand_a};
use crate::values::{dec, int, text};
use gyre_replica::{ColumnType, Value};

/// The size of a database: the specification's per warehouse, or scaled down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    pub warehouses: i64,
    pub items: i64,
    /// Customers (and initial orders) per district.
    pub customers: i64,
}

impl Scale {
    /// The specification's sizes for `warehouses` warehouses.
    pub fn full(warehouses: i64) -> Self {
        Self {
            warehouses,
            items: ITEMS,
            customers: CUSTOMERS,
        }
    }

    /// Scaled down to `customers` per district (quick runs), with items in the
    /// specification's proportion (100,000 to 3,000), at least 100; 0 keeps
    /// [`Scale::full`].
    pub fn with_customers(warehouses: i64, customers: i64) -> Self {
        if customers <= 0 {
            return Self::full(warehouses);
        }
        Self {
            warehouses,
            items: (customers * ITEMS / CUSTOMERS).max(100),
            customers,
        }
    }
}

/// The five transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::NewOrder,
        Kind::Payment,
        Kind::OrderStatus,
        Kind::Delivery,
        Kind::StockLevel,
    ];

    pub fn procedure(self) -> &'static str {
        match self {
            Kind::NewOrder => "tpcc_new_order",
            Kind::Payment => "tpcc_payment",
            Kind::OrderStatus => "tpcc_order_status",
            Kind::Delivery => "tpcc_delivery",
            Kind::StockLevel => "tpcc_stock_level",
        }
    }

    /// Whether the transaction only reads (and so writes no log entry).
    pub fn reads_only(self) -> bool {
        matches!(self, Kind::OrderStatus | Kind::StockLevel)
    }
}

/// One call a terminal makes.
#[derive(Debug, Clone)]
pub struct Call {
    pub kind: Kind,
    pub args: Vec<Value>,
}

impl Call {
    pub fn procedure(&self) -> &'static str {
        self.kind.procedure()
    }

    /// The call as SQL (`CALL tpcc_payment(1, 2, ...)`), for clients that speak SQL.
    pub fn sql(&self) -> String {
        call_sql(self.procedure(), &self.args)
    }
}

/// `CALL procedure(args)` for one of [`crate::procedures`], its arguments written as
/// literals of the parameters' types.
pub fn call_sql(procedure: &str, args: &[Value]) -> String {
    let params = crate::procedures()
        .get(procedure)
        .expect("a TPC-C procedure")
        .params();
    let args: Vec<String> = args
        .iter()
        .zip(&params)
        .map(|(v, p)| sql_literal(v, p.column_type))
        .collect();
    format!("CALL {procedure}({})", args.join(", "))
}

/// A value as a SQL literal of type `t`.
pub fn sql_literal(v: &Value, t: ColumnType) -> String {
    match (v, t) {
        (Value::Null, _) => "NULL".into(),
        (Value::Int(i), _) => i.to_string(),
        (Value::Decimal(d), ColumnType::Decimal { scale, precision }) => {
            let unit = 10i128.pow(scale.max(0) as u32);
            let sign = if *d < 0 { "-" } else { "" };
            format!(
                "CAST({sign}{}.{:0width$} AS DECIMAL({precision}, {scale}))",
                d.unsigned_abs() / unit as u128,
                d.unsigned_abs() % unit as u128,
                width = scale.max(0) as usize
            )
        }
        (Value::Timestamp(ns), _) => format!("to_timestamp_nanos({ns})"),
        (Value::Text(s), _) => format!("'{}'", s.replace('\'', "''")),
        (Value::IntList(l), _) => format!(
            "[{}]",
            l.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (other, t) => unreachable!("no TPC-C argument is a {other:?} for {t:?}"),
    }
}

/// Which transactions a terminal draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mix {
    /// The specification's mix (clause 5.2.3): 45 % New-Order, 43 % Payment and 4 %
    /// each of the other three.
    #[default]
    Full,
    /// New-Order and Payment alone, in the full mix's proportion (45 to 43): the
    /// transactions whose rate HyPer and ScyPer report per core.
    NewOrderPayment,
}

impl std::str::FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Mix::Full),
            "new-order-payment" => Ok(Mix::NewOrderPayment),
            _ => Err(format!(
                "unknown TPC-C mix {s:?}: give full or new-order-payment"
            )),
        }
    }
}

/// A terminal: a home warehouse and its own random sequence.
pub struct Terminal {
    r: Random,
    mix: Mix,
    scale: Scale,
    home: i64,
    /// The district whose stock levels this terminal checks (clause 2.8.1.1).
    district: i64,
    c: NuRandC,
}

impl Terminal {
    pub fn new(scale: Scale, home: i64, seed: u64) -> Self {
        Self {
            r: Random::for_parts(&[9, home as u64, seed]),
            mix: Mix::Full,
            scale,
            home,
            district: 1 + (seed % DISTRICTS as u64) as i64,
            c: NuRandC::RUN,
        }
    }

    /// The terminal drawing from `mix` (the full one by default).
    pub fn with_mix(mut self, mix: Mix) -> Self {
        self.mix = mix;
        self
    }

    /// The next transaction of the mix: 45 % New-Order, 43 % Payment and 4 % each of
    /// the other three (the minimum shares of clause 5.2.3 with New-Order the rest),
    /// or New-Order and Payment alone as 45 to 43.
    pub fn next(&mut self, now_ns: i64) -> Call {
        if self.mix == Mix::NewOrderPayment {
            return if self.r.uniform(1, 88) <= 45 {
                self.new_order(now_ns)
            } else {
                self.payment(now_ns)
            };
        }
        match self.r.uniform(1, 100) {
            1..=45 => self.new_order(now_ns),
            46..=88 => self.payment(now_ns),
            89..=92 => self.order_status(),
            93..=96 => self.delivery(now_ns),
            _ => self.stock_level(),
        }
    }

    fn c_id(&mut self) -> i64 {
        let n = self.scale.customers;
        self.r.nurand(nurand_a(n), self.c.c_id, 1, n)
    }

    /// A last name that exists in the database: the loader gives the first 1000
    /// customers of a district (fewer when scaled down) every name in turn.
    fn c_last(&mut self) -> String {
        let names = self.scale.customers.min(1000);
        last_name(self.r.nurand(nurand_a(names), self.c.last, 0, names - 1))
    }

    fn other_warehouse(&mut self) -> i64 {
        if self.scale.warehouses == 1 {
            return self.home;
        }
        let w = self.r.uniform(1, self.scale.warehouses - 1);
        if w >= self.home { w + 1 } else { w }
    }

    pub fn new_order(&mut self, now_ns: i64) -> Call {
        let d = self.r.uniform(1, DISTRICTS);
        let c = self.c_id();
        let lines = self.r.uniform(5, 15);
        let rollback = self.r.uniform(1, 100) == 1;
        let mut items = vec![];
        let mut supply = vec![];
        let mut quantities = vec![];
        for n in 1..=lines {
            let item = if rollback && n == lines {
                self.scale.items + 1
            } else {
                self.r.nurand(
                    nurand_a(self.scale.items),
                    self.c.ol_i_id,
                    1,
                    self.scale.items,
                )
            };
            items.push(item);
            supply.push(if self.r.uniform(1, 100) == 1 {
                self.other_warehouse()
            } else {
                self.home
            });
            quantities.push(self.r.uniform(1, 10));
        }
        Call {
            kind: Kind::NewOrder,
            args: vec![
                int(self.home),
                int(d),
                int(c),
                Value::IntList(items),
                Value::IntList(supply),
                Value::IntList(quantities),
                Value::Timestamp(now_ns),
            ],
        }
    }

    /// The customer of a Payment or Order-Status: by last name 60 % of the time.
    fn customer_args(&mut self) -> [Value; 2] {
        if self.r.uniform(1, 100) <= 60 {
            [Value::Null, text(self.c_last())]
        } else {
            [int(self.c_id()), Value::Null]
        }
    }

    pub fn payment(&mut self, now_ns: i64) -> Call {
        let d = self.r.uniform(1, DISTRICTS);
        let (c_w, c_d) = if self.r.uniform(1, 100) <= 85 || self.scale.warehouses == 1 {
            (self.home, d)
        } else {
            (self.other_warehouse(), self.r.uniform(1, DISTRICTS))
        };
        let [c_id, c_last] = self.customer_args();
        Call {
            kind: Kind::Payment,
            args: vec![
                int(self.home),
                int(d),
                int(c_w),
                int(c_d),
                c_id,
                c_last,
                dec(self.r.uniform(100, 500_000)),
                Value::Timestamp(now_ns),
            ],
        }
    }

    pub fn order_status(&mut self) -> Call {
        let d = self.r.uniform(1, DISTRICTS);
        let [c_id, c_last] = self.customer_args();
        Call {
            kind: Kind::OrderStatus,
            args: vec![int(self.home), int(d), c_id, c_last],
        }
    }

    pub fn delivery(&mut self, now_ns: i64) -> Call {
        Call {
            kind: Kind::Delivery,
            args: vec![
                int(self.home),
                int(self.r.uniform(1, 10)),
                Value::Timestamp(now_ns),
            ],
        }
    }

    pub fn stock_level(&mut self) -> Call {
        Call {
            kind: Kind::StockLevel,
            args: vec![
                int(self.home),
                int(self.district),
                int(self.r.uniform(10, 20)),
            ],
        }
    }
}
