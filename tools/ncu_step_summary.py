import csv,os,collections,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
hdr=rows[0]; rows=rows[1:]
ki=hdr.index('Kernel Name'); vi=hdr.index('Metric Value')
vals=[(r[ki], float(r[vi].replace(',',''))) for r in rows]
# The LM head is the longest kernel of a decode step: its launches delimit the steps.
thr=float(sys.argv[2]) if len(sys.argv)>2 else 0.5*max(v for n,v in vals)
big=[i for i,(n,v) in enumerate(vals) if v>thr]
s,e=big[-2]+1,big[-1]+1
st=collections.OrderedDict(); tot=0
for n,v in vals[s:e]:
    k=n[:60]; st.setdefault(k,[0,0.0]); st[k][0]+=1; st[k][1]+=v; tot+=v
print('kernels in last step',e-s,'sum of durations us',round(tot/1e3,1))
for k,(c,v) in sorted(st.items(), key=lambda kv:-kv[1][1]): print(f'{k:60s} {c:4d} {v/c/1e3:8.2f} {v/1e3:9.1f}')
