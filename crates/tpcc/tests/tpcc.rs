//! TPC-C on the primary: the loaded database and every state the transaction mix
//! leaves satisfy the specification's consistency conditions, each transaction does
//! what its clause says, and the log (logical or physical) replays to the same state.

use gyre_replica::{Database, Key, LogMode, Options, Row, Store, Value};
use gyre_tpcc::consistency::violations;
use gyre_tpcc::load::first_new_order;
use gyre_tpcc::schema::col;
use gyre_tpcc::{Kind, Scale, Terminal, create_and_load, procedures};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const SCALE: Scale = Scale {
    warehouses: 2,
    items: 2000,
    customers: 90,
};
const LOAD_TIME: i64 = 1_700_000_000_000_000_000;

fn loaded(options: Options) -> Database {
    let db = Database::open(options, procedures()).unwrap();
    create_and_load(&db, SCALE, LOAD_TIME).unwrap();
    db
}

fn table(store: &Store, name: &str) -> Vec<Row> {
    let id = store.table_id(name).unwrap();
    store.table(id).unwrap().rows.values().cloned().collect()
}

fn row(store: &Store, name: &str, key: &[i64]) -> Option<Row> {
    let id = store.table_id(name).unwrap();
    let key: Vec<Value> = key.iter().map(|k| Value::Int(*k)).collect();
    store
        .table(id)
        .unwrap()
        .rows
        .get(&Key::encode(&key))
        .cloned()
}

fn assert_consistent(store: &Store) {
    let v = violations(store).unwrap();
    assert!(v.is_empty(), "inconsistent:\n{}", v.join("\n"));
}

#[test]
fn load_has_the_specified_rows_and_is_consistent() {
    let db = loaded(Options::default());
    let s = db.snapshot();
    let (w, c) = (SCALE.warehouses as usize, SCALE.customers as usize);
    assert_eq!(table(&s, "item").len(), SCALE.items as usize);
    assert_eq!(table(&s, "warehouse").len(), w);
    assert_eq!(table(&s, "stock").len(), w * SCALE.items as usize);
    assert_eq!(table(&s, "district").len(), w * 10);
    assert_eq!(table(&s, "customer").len(), w * 10 * c);
    assert_eq!(table(&s, "history").len(), w * 10 * c);
    assert_eq!(table(&s, "orders").len(), w * 10 * c);
    let undelivered = c - first_new_order(SCALE.customers) as usize + 1;
    assert_eq!(undelivered, c * 900 / 3000);
    assert_eq!(table(&s, "new_order").len(), w * 10 * undelivered);
    let lines = table(&s, "order_line").len();
    assert!(
        (w * 10 * c * 5..=w * 10 * c * 15).contains(&lines),
        "{lines}"
    );
    let originals = table(&s, "item")
        .iter()
        .filter(|r| r[col::item::DATA].as_text().unwrap().contains("ORIGINAL"))
        .count();
    assert!(
        (100..300).contains(&originals),
        "{originals} of 2000 ORIGINAL"
    );
    assert_consistent(&s);
}

/// The same load twice draws the same data: a logged load replays.
#[test]
fn load_is_deterministic() {
    let a = loaded(Options::default()).snapshot();
    let b = loaded(Options::default()).snapshot();
    for t in ["stock", "customer", "order_line"] {
        assert_eq!(table(&a, t), table(&b, t), "{t}");
    }
}

#[test]
fn new_order_enters_an_order_and_takes_stock() {
    let db = loaded(Options::default());
    let before = db.snapshot();
    let stock_of = |s: &Store, i: i64| row(s, "stock", &[1, i]).unwrap();
    let q = |r: &Row, i: usize| r[i].as_int().unwrap();
    // Item 7 from warehouse 2 (remote), items 3 and 5 locally.
    let items = vec![3, 5, 7];
    let supply = vec![1, 1, 2];
    let quantities = vec![4, 95, 2];
    let out = db
        .call(
            "tpcc_new_order",
            &[
                Value::Int(1),
                Value::Int(4),
                Value::Int(17),
                Value::IntList(items.clone()),
                Value::IntList(supply.clone()),
                Value::IntList(quantities.clone()),
                Value::Timestamp(LOAD_TIME + 1),
            ],
        )
        .unwrap();
    let after = db.snapshot();
    let o_id = SCALE.customers + 1;
    assert_eq!(out[0][0], Value::Int(o_id));
    assert_eq!(
        q(
            &row(&after, "district", &[1, 4]).unwrap(),
            col::district::NEXT_O_ID
        ),
        o_id + 1
    );
    assert!(row(&after, "new_order", &[1, 4, o_id]).is_some());
    let order = row(&after, "orders", &[1, 4, o_id]).unwrap();
    assert_eq!(order[col::orders::OL_CNT], Value::Int(3));
    assert_eq!(order[7], Value::Int(0), "not all local");
    // Stock: down by the quantity while 10 would remain, else up by 91 less it.
    for (i, w, qty) in [(3, 1, 4), (5, 1, 95), (7, 2, 2)] {
        let old = row(&before, "stock", &[w, i]).unwrap();
        let new = row(&after, "stock", &[w, i]).unwrap();
        let s = q(&old, col::stock::QUANTITY);
        let expected = if s >= qty + 10 { s - qty } else { s - qty + 91 };
        assert_eq!(q(&new, col::stock::QUANTITY), expected);
        assert_eq!(q(&new, col::stock::YTD), q(&old, col::stock::YTD) + qty);
        assert_eq!(q(&new, col::stock::ORDER_CNT), 1);
        assert_eq!(q(&new, col::stock::REMOTE_CNT), i64::from(w != 1));
    }
    // The total: sum(quantity * price) * (1 - discount) * (1 + w_tax + d_tax).
    let price = |i: i64| {
        row(&after, "item", &[i]).unwrap()[col::item::PRICE]
            .as_decimal()
            .unwrap()
    };
    let sum: i128 = items
        .iter()
        .zip(&quantities)
        .map(|(i, q)| price(*i) * i128::from(*q))
        .sum();
    let dec = |r: Row, i: usize| r[i].as_decimal().unwrap() as f64 / 10_000.0;
    let discount = dec(
        row(&after, "customer", &[1, 4, 17]).unwrap(),
        col::customer::DISCOUNT,
    );
    let taxes = dec(row(&after, "warehouse", &[1]).unwrap(), col::warehouse::TAX)
        + dec(
            row(&after, "district", &[1, 4]).unwrap(),
            col::district::TAX,
        );
    let total = sum as f64 / 100.0 * (1.0 - discount) * (1.0 + taxes);
    let got = out[0][2].as_decimal().unwrap() as f64 / 100.0;
    assert!((got - total).abs() <= 0.005 + 1e-9, "{got} vs {total}");
    assert_eq!(
        stock_of(&after, 3)[col::stock::DIST_01 + 3],
        order_line_dist(&after, o_id)
    );
    assert_consistent(&after);

    // An unused item number rolls everything back.
    let err = db
        .call(
            "tpcc_new_order",
            &[
                Value::Int(1),
                Value::Int(4),
                Value::Int(17),
                Value::IntList(vec![3, SCALE.items + 1]),
                Value::IntList(vec![1, 1]),
                Value::IntList(vec![1, 1]),
                Value::Timestamp(LOAD_TIME + 2),
            ],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("Item number is not valid"),
        "{err}"
    );
    let again = db.snapshot();
    assert_eq!(table(&again, "stock"), table(&after, "stock"));
    assert_eq!(table(&again, "district"), table(&after, "district"));
    assert_eq!(table(&again, "orders").len(), table(&after, "orders").len());
}

fn order_line_dist(s: &Store, o_id: i64) -> Value {
    row(s, "order_line", &[1, 4, o_id, 1]).unwrap()[9].clone()
}

#[test]
fn payment_by_last_name_takes_the_middle_one_by_first_name() {
    let db = loaded(Options::default());
    // Three more customers of district 1/2 named like customer 5, each with the
    // 10.00 payment of a loaded customer (so that the books still balance); the one
    // in the middle by first name (the 2nd of 4) pays.
    let base = row(&db.snapshot(), "customer", &[1, 2, 5]).unwrap();
    db.transaction(|txn| {
        let customer = txn.table("customer")?;
        let by_name = txn.table("customer_name")?;
        let history = txn.table("history")?;
        for (table, key, ytd) in [
            ("warehouse", vec![Value::Int(1)], col::warehouse::YTD),
            (
                "district",
                vec![Value::Int(1), Value::Int(2)],
                col::district::YTD,
            ),
        ] {
            let id = txn.table(table)?;
            let mut r = txn.get(id, &key)?.unwrap().to_vec();
            r[ytd] = Value::Decimal(r[ytd].as_decimal().unwrap() + 3000);
            txn.update(id, r)?;
        }
        for (id, first) in [(1001, "Zed"), (1002, "Al"), (1003, "Mo")] {
            let mut r = base.to_vec();
            r[0] = Value::Int(id);
            r[col::customer::FIRST] = Value::Text(first.into());
            // A customer comes with its row in the name index.
            let name = [1, 2].map(Value::Int).to_vec();
            let name = [
                name,
                vec![
                    r[col::customer::LAST].clone(),
                    r[col::customer::FIRST].clone(),
                ],
            ];
            let mut name = name.concat();
            name.push(Value::Int(id));
            txn.insert(by_name, name)?;
            txn.insert(customer, r)?;
            txn.insert(
                history,
                vec![
                    Value::Int(id),
                    Value::Int(2),
                    Value::Int(1),
                    Value::Int(2),
                    Value::Int(1),
                    Value::Timestamp(LOAD_TIME),
                    Value::Decimal(1000),
                    Value::Text("x".into()),
                    Value::Int(1),
                ],
            )?;
        }
        Ok(())
    })
    .unwrap();
    let mut names: Vec<(String, i64)> = [5, 1001, 1002, 1003]
        .iter()
        .map(|c| {
            let r = row(&db.snapshot(), "customer", &[1, 2, *c]).unwrap();
            (r[col::customer::FIRST].as_text().unwrap().to_string(), *c)
        })
        .collect();
    names.sort();
    let middle = names[1].1;
    let last = base[col::customer::LAST].clone();
    let out = db
        .call(
            "tpcc_payment",
            &[
                Value::Int(1),
                Value::Int(2),
                Value::Int(1),
                Value::Int(2),
                Value::Null,
                last,
                Value::Decimal(12_345),
                Value::Timestamp(LOAD_TIME + 5),
            ],
        )
        .unwrap();
    assert_eq!(out[0][0], Value::Int(middle));
    let s = db.snapshot();
    let c = row(&s, "customer", &[1, 2, middle]).unwrap();
    assert_eq!(c[col::customer::BALANCE], Value::Decimal(-1000 - 12_345));
    assert_eq!(c[col::customer::PAYMENT_CNT], Value::Int(2));
    assert!(row(&s, "history", &[1, 2, middle, 2]).is_some());
    assert_consistent(&s);
}

#[test]
fn delivery_delivers_each_districts_oldest_order() {
    let db = loaded(Options::default());
    let before = db.snapshot();
    let out = db
        .call(
            "tpcc_delivery",
            &[
                Value::Int(2),
                Value::Int(7),
                Value::Timestamp(LOAD_TIME + 9),
            ],
        )
        .unwrap();
    let first = first_new_order(SCALE.customers);
    assert_eq!(out.len(), 10);
    let after = db.snapshot();
    for (d, r) in (1..=10).zip(&out) {
        assert_eq!(r, &vec![Value::Int(d), Value::Int(first)]);
        assert!(row(&after, "new_order", &[2, d, first]).is_none());
        let o = row(&after, "orders", &[2, d, first]).unwrap();
        assert_eq!(o[col::orders::CARRIER_ID], Value::Int(7));
        let c = o[col::orders::C_ID].as_int().unwrap();
        let amount: i128 = table(&after, "order_line")
            .iter()
            .filter(|l| l[..3] == [Value::Int(first), Value::Int(d), Value::Int(2)])
            .map(|l| l[col::order_line::AMOUNT].as_decimal().unwrap())
            .sum();
        let balance = |s: &Store| {
            row(s, "customer", &[2, d, c]).unwrap()[col::customer::BALANCE]
                .as_decimal()
                .unwrap()
        };
        assert_eq!(balance(&after), balance(&before) + amount);
    }
    assert_consistent(&after);
}

#[test]
fn stock_level_counts_distinct_low_items_of_the_last_twenty_orders() {
    let db = loaded(Options::default());
    let s = db.snapshot();
    for threshold in [10, 50, 101] {
        let next = row(&s, "district", &[1, 3]).unwrap()[col::district::NEXT_O_ID]
            .as_int()
            .unwrap();
        let items: BTreeSet<i64> = table(&s, "order_line")
            .iter()
            .filter(|l| l[1] == Value::Int(3) && l[2] == Value::Int(1))
            .filter(|l| (next - 20..next).contains(&l[0].as_int().unwrap()))
            .map(|l| l[col::order_line::I_ID].as_int().unwrap())
            .collect();
        let low = items
            .iter()
            .filter(|i| {
                row(&s, "stock", &[1, **i]).unwrap()[col::stock::QUANTITY]
                    .as_int()
                    .unwrap()
                    < threshold
            })
            .count();
        let out = db
            .call(
                "tpcc_stock_level",
                &[Value::Int(1), Value::Int(3), Value::Int(threshold)],
            )
            .unwrap();
        assert_eq!(
            out,
            vec![vec![Value::Int(low as i64)]],
            "threshold {threshold}"
        );
    }
}

/// Terminals on threads of their own run the mix; every state is consistent, the log
/// replays to the same state, and logical entries are several times smaller than
/// physical ones, as in the thesis (250 against 1500 bytes per transaction).
#[test]
fn mix_stays_consistent_and_replays_in_both_log_modes() {
    let mut bytes_per_tx = BTreeMap::new();
    for mode in [LogMode::Logical, LogMode::Physical] {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            log_mode: mode,
            ..Options::durable(dir.path())
        };
        let db = Arc::new(loaded(options.clone()));
        let entries_before = db.log_stats().unwrap();
        let terminals = 4;
        let per_terminal = 400;
        let outcomes: Vec<BTreeMap<(Kind, bool), u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..terminals)
                .map(|t| {
                    let db = Arc::clone(&db);
                    s.spawn(move || {
                        let home = 1 + t % SCALE.warehouses;
                        let mut terminal = Terminal::new(SCALE, home, t as u64);
                        let mut outcomes = BTreeMap::new();
                        for i in 0..per_terminal {
                            let call = terminal.next(LOAD_TIME + 1000 * i);
                            let result = db.call(call.procedure(), &call.args);
                            if let Err(e) = &result {
                                assert!(
                                    call.kind == Kind::NewOrder
                                        && e.to_string().contains("Item number is not valid"),
                                    "{:?} failed: {e}",
                                    call
                                );
                            }
                            *outcomes.entry((call.kind, result.is_ok())).or_insert(0) += 1;
                        }
                        outcomes
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut total: BTreeMap<(Kind, bool), u32> = BTreeMap::new();
        for o in outcomes {
            for (k, n) in o {
                *total.entry(k).or_default() += n;
            }
        }
        let new_orders = total.get(&(Kind::NewOrder, true)).copied().unwrap_or(0);
        let rolled_back = total.get(&(Kind::NewOrder, false)).copied().unwrap_or(0);
        assert!(new_orders > 500, "{total:?}");
        assert!(rolled_back < new_orders / 20, "{total:?}");
        for k in Kind::ALL {
            assert!(total.contains_key(&(k, true)), "no {k:?} ran: {total:?}");
        }
        let state = db.snapshot();
        assert_consistent(&state);
        let stats = db.log_stats().unwrap();
        let writers: u32 = total
            .iter()
            .filter(|((k, ok), _)| *ok && !k.reads_only())
            .map(|(_, n)| n)
            .sum();
        assert_eq!(stats.entries - entries_before.entries, u64::from(writers));
        bytes_per_tx.insert(
            format!("{mode:?}"),
            (stats.raw_bytes - entries_before.raw_bytes) / u64::from(writers),
        );
        drop(db);

        let reopened = Database::open(options, procedures()).unwrap();
        let replayed = reopened.snapshot();
        for t in gyre_tpcc::schema::tables() {
            assert_eq!(
                table(&replayed, t.name),
                table(&state, t.name),
                "{mode:?}: {}",
                t.name
            );
        }
        assert_consistent(&replayed);
    }
    let (logical, physical) = (bytes_per_tx["Logical"], bytes_per_tx["Physical"]);
    println!("log bytes per writing transaction: logical {logical}, physical {physical}");
    assert!(
        physical > 3 * logical,
        "logical {logical} B, physical {physical} B"
    );
}

/// The conditions catch what they are about: money that appears from nowhere, an
/// order line without its order's count.
#[test]
fn violations_are_found() {
    let db = loaded(Options::default());
    db.transaction(|txn| {
        let district = txn.table("district")?;
        let mut r = txn
            .get(district, &[Value::Int(1), Value::Int(1)])?
            .unwrap()
            .to_vec();
        r[col::district::YTD] = Value::Decimal(r[col::district::YTD].as_decimal().unwrap() + 1);
        txn.update(district, r)?;
        let order_line = txn.table("order_line")?;
        let key = [Value::Int(2), Value::Int(5), Value::Int(1), Value::Int(1)];
        let line = txn.get(order_line, &key)?.unwrap().to_vec();
        let mut extra = line;
        extra[3] = Value::Int(99);
        txn.insert(order_line, extra)
    })
    .unwrap();
    let v = violations(&db.snapshot()).unwrap();
    for condition in ["1:", "9:", "4:", "6:"] {
        assert!(
            v.iter().any(|m| m.starts_with(condition)),
            "{condition} in {v:?}"
        );
    }
}
