//! TPC-C's consistency conditions (clause 3.3.2, conditions 1 to 10 and 12): checks of
//! a whole database state that any correct execution keeps true, used on the primary
//! and on every state recovered or replayed from the log.

use crate::schema::col;
use crate::values::{dec_of, int_of};
use gyre_replica::{Result, Row, Store, Value};
use std::collections::{BTreeMap, BTreeSet};

type District = (i64, i64);
type Order = (i64, i64, i64);
type Customer = (i64, i64, i64);

fn rows<'s>(store: &'s Store, table: &str) -> Result<impl Iterator<Item = &'s Row> + 's> {
    Ok(store.table(store.table_id(table)?)?.rows.values())
}

/// The conditions `store` violates, described (at most 20); empty when it is consistent.
pub fn violations(store: &Store) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut fail = |s: String| {
        if out.len() < 20 {
            out.push(s);
        }
    };

    let mut d_ytd_sum: BTreeMap<i64, i128> = BTreeMap::new();
    let mut districts: BTreeMap<District, (i128, i64)> = BTreeMap::new();
    for d in rows(store, "district")? {
        let key = (int_of(d, col::district::W_ID), int_of(d, 0));
        *d_ytd_sum.entry(key.0).or_default() += dec_of(d, col::district::YTD);
        districts.insert(
            key,
            (
                dec_of(d, col::district::YTD),
                int_of(d, col::district::NEXT_O_ID),
            ),
        );
    }
    let mut h_by_w: BTreeMap<i64, i128> = BTreeMap::new();
    let mut h_by_d: BTreeMap<District, i128> = BTreeMap::new();
    let mut h_by_c: BTreeMap<Customer, i128> = BTreeMap::new();
    for h in rows(store, "history")? {
        let amount = dec_of(h, col::history::AMOUNT);
        let (w, d) = (int_of(h, col::history::W_ID), int_of(h, col::history::D_ID));
        *h_by_w.entry(w).or_default() += amount;
        *h_by_d.entry((w, d)).or_default() += amount;
        let c = (
            int_of(h, col::history::C_W_ID),
            int_of(h, col::history::C_D_ID),
            int_of(h, col::history::C_ID),
        );
        *h_by_c.entry(c).or_default() += amount;
    }
    for w in rows(store, "warehouse")? {
        let (id, ytd) = (int_of(w, 0), dec_of(w, col::warehouse::YTD));
        let districts_ytd = d_ytd_sum.get(&id).copied().unwrap_or_default();
        if ytd != districts_ytd {
            fail(format!(
                "1: warehouse {id}: w_ytd {ytd} but its districts' d_ytd add up to {districts_ytd}"
            ));
        }
        let history = h_by_w.get(&id).copied().unwrap_or_default();
        if ytd != history {
            fail(format!(
                "8: warehouse {id}: w_ytd {ytd} but its history adds up to {history}"
            ));
        }
    }

    let mut new_orders: BTreeMap<District, Vec<i64>> = BTreeMap::new();
    let mut undelivered: BTreeSet<Order> = BTreeSet::new();
    for no in rows(store, "new_order")? {
        let (o, d, w) = (int_of(no, 0), int_of(no, 1), int_of(no, 2));
        new_orders.entry((w, d)).or_default().push(o);
        undelivered.insert((w, d, o));
    }
    let mut max_o: BTreeMap<District, i64> = BTreeMap::new();
    let mut ol_cnt_sum: BTreeMap<District, i64> = BTreeMap::new();
    let mut orders: BTreeMap<Order, (i64, bool, i64)> = BTreeMap::new();
    for o in rows(store, "orders")? {
        let key = (
            int_of(o, col::orders::W_ID),
            int_of(o, col::orders::D_ID),
            int_of(o, col::orders::ID),
        );
        let m = max_o.entry((key.0, key.1)).or_default();
        *m = (*m).max(key.2);
        let lines = int_of(o, col::orders::OL_CNT);
        *ol_cnt_sum.entry((key.0, key.1)).or_default() += lines;
        let carrier_null = o[col::orders::CARRIER_ID].is_null();
        if carrier_null != undelivered.contains(&key) {
            fail(format!(
                "5: order {key:?}: o_carrier_id is {}NULL but it is {}in NEW_ORDER",
                if carrier_null { "" } else { "not " },
                if carrier_null { "not " } else { "" }
            ));
        }
        orders.insert(key, (lines, carrier_null, int_of(o, col::orders::C_ID)));
    }
    for (&(w, d), &(ytd, next)) in &districts {
        let max = max_o.get(&(w, d)).copied().unwrap_or_default();
        if next - 1 != max {
            fail(format!(
                "2: district {w}/{d}: d_next_o_id {next} but the newest order is {max}"
            ));
        }
        if let Some(nos) = new_orders.get(&(w, d)) {
            let (lo, hi) = (nos.iter().min().unwrap(), nos.iter().max().unwrap());
            if *hi != max {
                fail(format!(
                    "2: district {w}/{d}: newest new order {hi}, newest order {max}"
                ));
            }
            if hi - lo + 1 != nos.len() as i64 {
                fail(format!(
                    "3: district {w}/{d}: new orders {lo}..={hi} but {} of them",
                    nos.len()
                ));
            }
        }
        let history = h_by_d.get(&(w, d)).copied().unwrap_or_default();
        if ytd != history {
            fail(format!(
                "9: district {w}/{d}: d_ytd {ytd} but its history adds up to {history}"
            ));
        }
    }

    let mut lines_by_d: BTreeMap<District, i64> = BTreeMap::new();
    let mut lines_by_o: BTreeMap<Order, i64> = BTreeMap::new();
    let mut delivered_by_c: BTreeMap<Customer, i128> = BTreeMap::new();
    for l in rows(store, "order_line")? {
        let key = (
            int_of(l, col::order_line::W_ID),
            int_of(l, col::order_line::D_ID),
            int_of(l, col::order_line::O_ID),
        );
        *lines_by_d.entry((key.0, key.1)).or_default() += 1;
        *lines_by_o.entry(key).or_default() += 1;
        let Some(&(_, carrier_null, c)) = orders.get(&key) else {
            fail(format!(
                "6: order line of order {key:?}, which does not exist"
            ));
            continue;
        };
        let delivery_null = l[col::order_line::DELIVERY_D].is_null();
        if delivery_null != carrier_null {
            fail(format!(
                "7: order {key:?}: a line's ol_delivery_d and o_carrier_id disagree on NULL"
            ));
        }
        if !delivery_null {
            *delivered_by_c.entry((key.0, key.1, c)).or_default() +=
                dec_of(l, col::order_line::AMOUNT);
        }
    }
    for order in &undelivered {
        if !orders.contains_key(order) {
            fail(format!("5: new order {order:?} has no order"));
        }
    }
    for (district, sum) in &ol_cnt_sum {
        let lines = lines_by_d.get(district).copied().unwrap_or_default();
        if *sum != lines {
            fail(format!(
                "4: district {district:?}: o_ol_cnt adds up to {sum}, {lines} order lines"
            ));
        }
    }
    for (order, (lines, _, _)) in &orders {
        let n = lines_by_o.get(order).copied().unwrap_or_default();
        if *lines != n {
            fail(format!("6: order {order:?}: o_ol_cnt {lines}, {n} lines"));
        }
    }

    for c in rows(store, "customer")? {
        let key = (int_of(c, 2), int_of(c, 1), int_of(c, 0));
        let balance = dec_of(c, col::customer::BALANCE);
        let delivered = delivered_by_c.get(&key).copied().unwrap_or_default();
        let paid = h_by_c.get(&key).copied().unwrap_or_default();
        if balance != delivered - paid {
            fail(format!(
                "10: customer {key:?}: c_balance {balance}, delivered {delivered} less paid {paid}"
            ));
        }
        let ytd = dec_of(c, col::customer::YTD_PAYMENT);
        if balance + ytd != delivered {
            fail(format!(
                "12: customer {key:?}: c_balance {balance} plus c_ytd_payment {ytd}, delivered {delivered}"
            ));
        }
    }

    // Not the specification's: the secondary indexes hold exactly the rows their
    // tables imply.
    let implied = |table: &str, columns: &[usize]| -> Result<BTreeSet<Vec<Value>>> {
        Ok(rows(store, table)?
            .map(|r| columns.iter().map(|&i| r[i].clone()).collect())
            .collect())
    };
    use col::{customer as c, orders as o};
    let by_name = implied("customer", &[c::W_ID, c::D_ID, c::LAST, c::FIRST, c::ID])?;
    let by_order = implied("orders", &[o::W_ID, o::D_ID, o::C_ID, o::ID])?;
    for (index, expected) in [("customer_name", by_name), ("customer_order", by_order)] {
        let held: BTreeSet<Vec<Value>> = rows(store, index)?.map(|r| r.to_vec()).collect();
        let wrong = held.symmetric_difference(&expected).count();
        if wrong > 0 {
            fail(format!(
                "index {index}: {wrong} rows differ from what its table implies"
            ));
        }
    }
    Ok(out)
}
